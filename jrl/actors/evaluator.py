"""Evaluator: mean return of a policy over a fixed number of whole episodes, in bounded time.

An evaluation always ends: each episode at most `max_episode_steps` agent steps (by default the env
family's cap, `jrl.pixel_envs.episode_step_cap`: 27,000 on Atari, as ALE v5's 108,000 frames; else
the env's own time limit), and at once when its stop predicate says so (a signal the run takes,
`jrl.run.core.RunCore.stop_requested`): the evaluation is then abandoned (`EvaluationAbandoned`) and
the evaluator is as before it, so the same evaluation k can be run again (a resumed run's).
"""

import time
from typing import Any, Callable, Dict, List, Optional

import jax
import numpy as np

from jrl import pixel_envs
from jrl.cpu_jit import jit_per_step
from jrl.envs import EnvLike, make_vector_env
from jrl.specs import env_action, observation_dtype
from jrl.types import Params, PolicyFns

# Seconds between an evaluation's progress lines: a long one (Atari: up to 27,000 steps) shows it is
# alive, a short one (CartPole: a second) prints none. A run's are its progress lines' cadence
# (`RunCore.eval_progress_seconds`).
PROGRESS_SECONDS = 10.0


class EvaluationAbandoned(Exception):
  """An evaluation ended early by its stop predicate; its returns do not exist."""

  def __init__(self, index: int, steps: int):
    super().__init__(f"evaluation {index} abandoned after {steps} steps")
    self.index, self.steps = index, steps


def never() -> bool:
  """The stop predicate of an evaluator that nothing stops."""
  return False


def progress_text(index: int, done: int, episodes: int, steps: int) -> str:
  """An evaluation's progress line: its episodes ended so far and the steps taken."""
  return f"eval {index}: {done}/{episodes} episodes done, {steps} steps"


class Evaluator:
  """Runs `num_episodes` episodes in parallel (one per env, the first episode of each).

  Evaluation k resets the envs with seed `seed + 1000 * k`, so runs repeat exactly.
  """

  def __init__(self, env: EnvLike, policy: PolicyFns, num_episodes: int, seed: int, first_index: int = 0,
               env_kwargs: Optional[Dict[str, Any]] = None, max_episode_steps: Optional[int] = None,
               should_stop: Callable[[], bool] = never, progress: Optional[Callable[[str], Any]] = None,
               progress_seconds: float = PROGRESS_SECONDS):
    """`env`: a gymnasium id, a factory returning a `gymnasium.Env` (or `"pkg.module:function"`).
    `first_index` k: the first `run` is evaluation k (its env seeds and policy key), as if k
    evaluations had run. `env_kwargs` go to `make_vector_env` (e.g. render_mode, wrappers).
    `max_episode_steps`: an episode still running after that many steps ends there (truncated; its
    return so far counts); None: the env family's cap (`pixel_envs.episode_step_cap`), if any.
    `should_stop`: asked after every step; True abandons the evaluation (`EvaluationAbandoned`).
    `progress`: takes a line (`progress_text`) every `progress_seconds` of a long evaluation."""
    self._env = make_vector_env(env, num_episodes, seed, evaluation=True, **(env_kwargs or {}))
    self._obs_dtype = observation_dtype(self._env.single_observation_space)
    self._select_action = jit_per_step(policy.select_action)
    self._policy = policy
    self._seed = seed
    self.max_episode_steps = pixel_envs.episode_step_cap(env) if max_episode_steps is None else max_episode_steps
    self._should_stop, self._progress, self._progress_seconds = should_stop, progress, progress_seconds
    self._key = jax.random.PRNGKey(seed)
    for _ in range(first_index):  # the keys of evaluations 0 .. k-1
      self._key, _ = jax.random.split(self._key)
    self._count = first_index

  @property
  def next_index(self) -> int:
    """The index k of the next evaluation (its envs reset with seed + 1000 * k)."""
    return self._count

  def run(self, params: Params) -> List[float]:
    """The returns of evaluation k's episodes; EvaluationAbandoned (the evaluator still before
    evaluation k) when `should_stop` says so."""
    index = self._count
    obs, _ = self._env.reset(seed=self._seed + 1000 * index)
    next_key, key = jax.random.split(self._key)
    n = self._env.num_envs
    state = self._policy.init(key, n)
    returns = np.zeros(n)
    running = np.ones(n, bool)
    is_first = np.ones(n, bool)
    steps, last_line = 0, time.monotonic()
    # All envs start together, so `steps` is the length of every episode still running.
    while running.any() and (self.max_episode_steps is None or steps < self.max_episode_steps):
      action, _, state = self._select_action(params, np.asarray(obs, self._obs_dtype), is_first, state)
      obs, reward, terminated, truncated, _ = self._env.step(env_action(action, self._env.single_action_space))
      steps += 1
      is_first = np.logical_or(terminated, truncated)  # ended envs restart (their returns no longer count)
      returns += reward * running
      running &= ~np.logical_or(terminated, truncated)
      if self._should_stop():
        raise EvaluationAbandoned(index, steps)
      if self._progress is not None and time.monotonic() - last_line >= self._progress_seconds:
        last_line = time.monotonic()
        self._progress(progress_text(index, int(n - running.sum()), n, steps))
    self._key, self._count = next_key, index + 1  # only a whole evaluation moves the evaluator on
    return [float(r) for r in returns]

  def state(self):
    return {"count": self._count, "key": np.asarray(jax.device_get(self._key))}

  def restore(self, state) -> None:
    self._count, self._key = state["count"], jax.device_put(state["key"])

  def close(self):
    self._env.close()
