"""One object for your own training loop: adder, blocks, seeded buffer, batches and the
schedule of updates, in this process.

    replay = LocalReplay.for_agent(cfg, num_envs=8, seed=0)    # or LocalReplay(spec, 8, 0, batch_size=...)
    next_obs, reward, terminated, truncated, info = env.step(action)
    replay.add(obs, action, reward, terminated, truncated, next_obs, info)
    while replay.updates_due() >= U:
      state, metrics = update_many(state, replay.sample(U))   # leaves [U, B, ...]
    saved = replay.state()                                      # data; replay.restore(saved) goes on

`calls_due` is the rule that schedules learner calls, shared with the embedded runner.
"""

import copy
import dataclasses
from typing import Any, Dict, Optional

import gymnasium as gym
import numpy as np

from jrl.envs import check_same_step_autoreset, final_observations
from jrl.errors import ConfigError
from jrl.replay.adders import make_block_writer
from jrl.replay.batches import PreparedBatch, item_priorities, items_per_fetch, make_assembler
from jrl.replay.buffer import SeededReplayBuffer
from jrl.replay.kinds import Transitions
from jrl.replay.spec import ReplaySpec
from jrl.types import LearnerBatch


def calls_due(rows: int, spec: ReplaySpec, samples_per_call: int) -> int:
  """Learner calls owed, in total, once `rows` rows are in replay (the spec's item kind's
  `calls_due`). A trajectory queue: one call per `samples_per_call` trajectories written.
  Transitions and replayed sequences: none below `spec.min_size`, then one, and one more for
  every `samples_per_call` samples that `samples_per_insert` x (rows - min_size) allows (the
  ratio Reverb's rate limiter keeps).
  """
  return spec.kind.calls_due(spec, rows, samples_per_call)


class LocalReplay:
  """Replay for a vector env stepped by your own loop, seeded: same seed, same batches.

  `add` takes one vector step (as gymnasium returns it) and recovers the true final
  observations itself, so the env must autoreset in the SAME step (`jrl.envs.make_vector_env`
  does; pass `env` to have it checked at once, else the first episode end without
  `info["final_obs"]` is refused, before any transition across it is written).
  What is stored is the spec's item kind (`jrl.replay.kinds`), rewards clipped as it says:
  n-step `Transitions` (sum_{k<n} gamma^k r, gamma^n or 0 at termination; `n_step` and
  `discount`, where given, replace the kind's), a `TrajectoryQueue` of trajectories [T], or
  `ReplayedSequences` (R2D2) that start with the policy's core state, which `add` takes from
  `extras[START_STATE_KEY]`.
  """

  def __init__(self, spec: ReplaySpec, num_envs: int, seed: int, *, batch_size: int, n_step: Optional[int] = None,
               discount: Optional[float] = None, env: Optional[gym.vector.VectorEnv] = None):
    if batch_size <= 0:
      raise ConfigError("batch_size", f"must be > 0, got {batch_size}")
    if env is not None:
      check_same_step_autoreset(env)
      if env.num_envs != num_envs:
        raise ConfigError("num_envs", f"the env steps {env.num_envs} envs, got num_envs={num_envs}")
    folding = {k: v for k, v in (("n_step", n_step), ("discount", discount)) if v is not None}
    if folding and isinstance(spec.kind, Transitions):  # the keywords from before item kinds
      spec = dataclasses.replace(spec, kind=dataclasses.replace(spec.kind, **folding))
    self.spec = spec
    self.num_envs = num_envs
    self.batch_size = batch_size
    self._buffer = SeededReplayBuffer(spec, seed)
    self._rng = np.random.default_rng(seed + 1)  # deals sampled transitions into batches
    self._adder: Any = spec.make_adder(num_envs)
    self._writer = make_block_writer(spec, self._buffer)
    self.updates_sampled = 0
    self._last: Optional[PreparedBatch] = None

  @classmethod
  def for_agent(cls, cfg: Any, num_envs: int, seed: int, env: Optional[gym.vector.VectorEnv] = None) -> "LocalReplay":
    """From an agent config: its `replay_spec()` (which names the item kind and its options) and `batch_size`."""
    return cls(cfg.replay_spec(), num_envs, seed, batch_size=cfg.batch_size, env=env)

  @property
  def rows(self) -> int:
    """Transitions (or sequences) in replay so far, evicted ones included."""
    return self._writer.transitions_written

  @property
  def size(self) -> int:
    """Items held now (blocks of transitions, or sequences not yet sampled)."""
    return self._buffer.size

  def add(self, obs: np.ndarray, action: np.ndarray, reward: np.ndarray, terminated: np.ndarray,
          truncated: np.ndarray, next_obs: np.ndarray, info: Dict[str, Any],
          extras: Optional[Dict[str, np.ndarray]] = None) -> None:
    """One vector step: obs [E, ...] the step was taken from, action [E, ...], reward,
    terminated, truncated [E], next_obs [E, ...] and info as `env.step` returned them;
    `extras` [E, ...] what the policy reported (sequences keep them, e.g. PPO's log-probs)."""
    done = np.logical_or(terminated, truncated)
    if done.any() and "final_obs" not in info:
      raise ConfigError("env", "an episode ended without info['final_obs']: the vector env does not autoreset in "
                               "the SAME step, so the next step would be written across the episode boundary "
                               "(make it with jrl.envs.make_vector_env, or pass vector_kwargs={'autoreset_mode': "
                               "gym.vector.AutoresetMode.SAME_STEP})")
    bootstrap = final_observations(np.asarray(next_obs), done, info)
    rows = self._adder.add(np.asarray(obs), np.asarray(action), np.asarray(reward, np.float32),
                           np.asarray(terminated), np.asarray(truncated), bootstrap, extras)
    self._writer.add(rows)

  def updates_due(self) -> int:
    """Updates of `batch_size` owed now (`calls_due` with one update per call), less those sampled.
    Sample them in a fixed number per call (`sample(U)` while `updates_due() >= U`) so that a
    jitted multi-update compiles once."""
    return max(0, calls_due(self.rows, self.spec, self.batch_size) - self.updates_sampled)

  def sample(self, updates: int = 1) -> LearnerBatch:
    """`updates` batches, stacked: leaves [U, B, ...] (transitions) or [U, B, T, ...] (on-policy
    sequences, each used once; R2D2's, sampled as transitions are); weights [U, B] (importance
    weights with prioritized replay, else 1)."""
    if updates <= 0:
      raise ValueError(f"updates must be > 0, got {updates}")
    spec, b = self.spec, self.batch_size
    sampled = self._buffer.sample(items_per_fetch(spec, updates, b))
    prepared = make_assembler(spec, updates, b, self._rng)(sampled)
    self.updates_sampled += updates
    self._last = prepared
    return prepared.batch

  def state(self) -> Dict[str, Any]:
    """A copy of everything this replay would go on from, as data (arrays and plain values: a
    checkpoint's run state keeps such data): the buffer's contents and sampling RNG, the batch RNG,
    the adder's open windows, the partial block and the updates sampled. `restore` on a
    LocalReplay made with the same arguments continues exactly."""
    return copy.deepcopy({"buffer": self._buffer.state(), "rng": self._rng.bit_generator.state,
                          "adder": self._adder.state(), "writer": self._writer.state(),
                          "updates_sampled": self.updates_sampled})

  def restore(self, state: Dict[str, Any]) -> None:
    state = copy.deepcopy(state)
    self._buffer.restore(state["buffer"])
    self._rng.bit_generator.state = state["rng"]
    self._adder.restore(state["adder"])
    self._writer.restore(state["writer"])
    self.updates_sampled = state["updates_sampled"]
    self._last = None

  def update_priorities(self, priorities: np.ndarray) -> None:
    """New priorities [U, B] (e.g. |TD| from the learner's metrics) for the last sample's items."""
    if self._last is None:
      raise RuntimeError("update_priorities before any sample")
    self._buffer.update_priorities(item_priorities(np.asarray(priorities), self._last.item_keys,
                                                   self._last.item_index))
