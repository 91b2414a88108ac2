"""One object for your own training loop: adder, blocks, seeded buffer, batches and the
schedule of updates, in this process.

    replay = LocalReplay.for_agent(cfg, num_envs=8, seed=0)    # or LocalReplay(spec, 8, 0, batch_size=...)
    next_obs, reward, terminated, truncated, info = env.step(action)
    replay.add(obs, action, reward, terminated, truncated, next_obs, info)
    while replay.updates_due() >= U:
      state, metrics = update_many(state, replay.sample(U))   # leaves [U, B, ...]
    saved = replay.state()                                      # picklable; replay.restore(saved) goes on

`calls_due` is the rule that schedules learner calls, shared with the embedded runner.
"""

import copy
from typing import Any, Dict, Optional

import gymnasium as gym
import numpy as np

from jrl.envs import check_same_step_autoreset, final_observations
from jrl.errors import ConfigError
from jrl.replay.adders import make_block_writer, make_step_adder
from jrl.replay.batches import (PreparedBatch, assemble_sequence_batches, item_priorities, items_per_fetch,
                                make_assembler)
from jrl.replay.buffer import SeededReplayBuffer
from jrl.replay.spec import ReplaySpec
from jrl.types import LearnerBatch


def calls_due(rows: int, spec: ReplaySpec, samples_per_call: int) -> int:
  """Learner calls owed, in total, once `rows` rows are in replay.

  Sequences (on-policy): one call per `samples_per_call` sequences written. Transitions: none
  below `spec.min_size`, then one, and one more for every `samples_per_call` samples that
  `samples_per_insert` x (rows - min_size) allows (the ratio Reverb's rate limiter keeps).
  """
  if spec.sequences:
    return rows // samples_per_call
  if rows < spec.min_size:
    return 0
  return int((rows - spec.min_size) * spec.samples_per_insert // samples_per_call) + 1


class LocalReplay:
  """Replay for a vector env stepped by your own loop, seeded: same seed, same batches.

  `add` takes one vector step (as gymnasium returns it) and recovers the true final
  observations itself, so the env must autoreset in the SAME step (`jrl.envs.make_vector_env`
  does; pass `env` to have it checked at once, else the first episode end without
  `info["final_obs"]` is refused, before any transition across it is written).
  Transitions are n-step (`n_step`, `discount`: sum_{k<n} gamma^k r, gamma^n or 0 at
  termination); with `spec.sequences` items are trajectories [T] of `spec.sequence_length`;
  with `spec.replayed_sequences` (R2D2) overlapping sequences that start with the policy's
  core state, which `add` takes from `extras[START_STATE_KEY]`.
  """

  def __init__(self, spec: ReplaySpec, num_envs: int, seed: int, *, batch_size: int, n_step: int = 1,
               discount: float = 0.99, env: Optional[gym.vector.VectorEnv] = None):
    if batch_size <= 0:
      raise ConfigError("batch_size", f"must be > 0, got {batch_size}")
    if env is not None:
      check_same_step_autoreset(env)
      if env.num_envs != num_envs:
        raise ConfigError("num_envs", f"the env steps {env.num_envs} envs, got num_envs={num_envs}")
    self.spec = spec
    self.num_envs = num_envs
    self.batch_size = batch_size
    self._buffer = SeededReplayBuffer(spec, seed)
    self._rng = np.random.default_rng(seed + 1)  # deals sampled transitions into batches
    self._adder: Any = make_step_adder(spec, num_envs, n_step, discount)
    self._writer = make_block_writer(spec, self._buffer)
    self.updates_sampled = 0
    self._last: Optional[PreparedBatch] = None

  @classmethod
  def for_agent(cls, cfg: Any, num_envs: int, seed: int, env: Optional[gym.vector.VectorEnv] = None) -> "LocalReplay":
    """From an agent config: its `replay_spec()`, `batch_size`, `n_step` (1 if none) and `discount`."""
    return cls(cfg.replay_spec(), num_envs, seed, batch_size=cfg.batch_size, n_step=getattr(cfg, "n_step", 1),
               discount=cfg.discount, env=env)

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
    if spec.sequences:  # U x B on-policy sequences from the queue, each used once, weights 1
      prepared = assemble_sequence_batches(self._buffer.sample(updates * b), updates, b, None)
    else:  # transitions dealt from pooled blocks, or replayed sequences (R2D2) as sampled
      sampled = self._buffer.sample(items_per_fetch(spec, updates, b))
      prepared = make_assembler(spec, updates, b, self._rng)(sampled)
    self.updates_sampled += updates
    self._last = prepared
    return prepared.batch

  def state(self) -> Dict[str, Any]:
    """A copy of everything this replay would go on from (picklable): the buffer's contents and
    sampling RNG, the batch RNG, the adder's open windows, the partial block and the updates
    sampled. `restore` on a LocalReplay made with the same arguments continues exactly."""
    return copy.deepcopy({"buffer": self._buffer.state(), "rng": self._rng.bit_generator.state,
                          "adder": self._adder, "writer": self._writer.state(),
                          "updates_sampled": self.updates_sampled})

  def restore(self, state: Dict[str, Any]) -> None:
    state = copy.deepcopy(state)
    self._buffer.restore(state["buffer"])
    self._rng.bit_generator.state = state["rng"]
    self._adder = state["adder"]
    self._writer.restore(state["writer"])
    self.updates_sampled = state["updates_sampled"]
    self._last = None

  def update_priorities(self, priorities: np.ndarray) -> None:
    """New priorities [U, B] (e.g. |TD| from the learner's metrics) for the last sample's items."""
    if self._last is None:
      raise RuntimeError("update_priorities before any sample")
    self._buffer.update_priorities(item_priorities(np.asarray(priorities), self._last.item_keys,
                                                   self._last.item_index))
