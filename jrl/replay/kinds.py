"""Replay item kinds: what an agent stores, and all that follows from it on every path.

An agent names its kind, with the options that change what is stored, in its replay spec,
as Acme's builders own their replay layout:

    ReplaySpec(kind=Transitions(n_step=cfg.n_step, discount=cfg.discount, reward_clip=cfg.reward_clip), ...)

- `Transitions`: n-step transitions (DQN, SAC), written in blocks of `spec.block_size` and
  sampled uniformly or by priority at `samples_per_insert` transitions per transition inserted.
- `TrajectoryQueue`: on-policy trajectories of `sequence_length` steps (PPO, IMPALA) in a FIFO
  queue: each is trained on by exactly one learner call, oldest first.
- `ReplayedSequences`: overlapping sequences of `sequence_length` steps, one every
  `sequence_period` steps, with the policy's core state at their start (R2D2); sampled as
  transitions are, counted in sequences.

A kind gives every path (the embedded runner, `LocalReplay`, the distributed nodes, the
device loop and `launch.advise`) its adder (reward clipping and n-step folding included), its
example item (the Reverb table's signature), block writer, batch assembler and learner-call
schedule, its table (a rate-limited table, or a queue where items are `sampled_once`: the
seeded buffer and `jrl.replay.reverb_replay.make_table` build it), and its on-device window
and ring (`jrl.replay.on_device`). The shells call these and never ask which kind they hold:
one composition, so a fix here is a fix everywhere. Each kind checks its own fields once,
naming the agent config's field. `spec` below is the `jrl.replay.spec.ReplaySpec` that holds
the kind: the table's size, sampling and rate limiting.
"""

import dataclasses
from typing import Any, Callable, ClassVar, Dict, NamedTuple, Optional, Tuple

import jax.numpy as jnp
import numpy as np

from jrl.errors import ConfigError, require_non_negative, require_positive, require_unit_interval
from jrl.replay import on_device
from jrl.replay.adders import BlockWriter, NStepTransitionAdder, RewardClipAdder, SequenceAdder
from jrl.replay.batches import assemble, assemble_sequence_batches, items_per_call
from jrl.replay.sequence_adder import (START_STATE_KEY, OverlappingSequenceAdder, RecurrentSequence,
                                      example_sequence)
from jrl.types import Trajectory, Transition

Extras = Callable[[], Dict[str, Any]]  # zeros (or shapes) of what the policy reports per env step


class DeviceLayout(NamedTuple):
  """What one iteration of the device loop does for a kind (`jrl.run.device.loop.Plan`)."""
  rollouts: int             # rollouts per iteration (a queue's)
  rollout_length: int       # vector steps per rollout
  calls_per_iteration: int  # learner calls each iteration makes itself (a queue's; replay kinds' are scheduled)
  iteration_steps: int      # env steps per iteration


@dataclasses.dataclass(frozen=True, kw_only=True)
class ItemKind:
  """The base: items replayed from a table (uniform or prioritized, rate-limited), one row per
  item; `Transitions` groups rows in blocks, `TrajectoryQueue` queues them instead."""
  reward_clip: float = 0.0  # each step's reward clipped to [-c, c] before it is stored (1 for Atari); 0: off

  sampled_once: ClassVar[bool] = False  # items leave replay as they are sampled, oldest first (a queue)
  row_type: ClassVar[Optional[type]] = None  # the NamedTuple of its rows: restored checkpoints rebuild them as such

  def __post_init__(self):
    if self.reward_clip < 0:
      raise ConfigError("reward_clip", f"must be >= 0 (0: off), got {self.reward_clip}")

  # What is stored.

  def make_adder(self, num_envs: int) -> Any:
    """The adder of a vector env of `num_envs` (`add(obs, action, reward, terminated, truncated,
    next_obs, extras)` -> the rows that step completes); rewards clipped first with `reward_clip`
    > 0 (the actor's episode returns stay the env's own)."""
    adder = self._adder(num_envs)
    return RewardClipAdder(adder, self.reward_clip) if self.reward_clip > 0 else adder

  def _adder(self, num_envs: int) -> Any:
    raise NotImplementedError

  def make_block_writer(self, spec, writer) -> BlockWriter:
    """Rows into items for `writer.insert(item, priority)`: one sequence per item."""
    return BlockWriter(writer, 1, squeeze=True, row_type=self.row_type)

  def example_row(self, step: Transition, extras: Extras) -> Any:
    """Zeros shaped like one row, from one env step's (unbatched `step`, and `extras()`)."""
    raise NotImplementedError

  def example_item(self, spec, step: Transition, extras: Extras) -> Any:
    """Zeros shaped like one replay item (the Reverb table's signature): one row."""
    return self.example_row(step, extras)

  # Sampling and the learner-call schedule.

  def updates_per_call(self, requested: int) -> int:
    """Updates one learner call makes when a run asks for `requested`."""
    return requested

  def items_per_fetch(self, spec, updates_per_call: int, batch_size: int) -> int:
    """Items one learner call samples."""
    return updates_per_call * batch_size

  def make_assembler(self, spec, updates_per_call: int, batch_size: int,
                     rng: np.random.Generator) -> Callable:
    """Sampled items (`items_per_fetch`) -> one call's PreparedBatch, leaves [U, B, ...]."""
    importance = spec.importance_exponent if spec.prioritized else None
    return lambda sampled: assemble_sequence_batches(sampled, updates_per_call, batch_size, importance)

  def calls_due(self, spec, rows: int, samples_per_call: int) -> int:
    """Learner calls owed, in total, once `rows` rows are in replay: none below `spec.min_size`,
    then one, and one more for every `samples_per_call` samples that `samples_per_insert` x
    (rows - min_size) allows (the ratio Reverb's rate limiter keeps)."""
    if rows < spec.min_size:
      return 0
    return int((rows - spec.min_size) * spec.samples_per_insert // samples_per_call) + 1

  def rows_scheduled(self, spec, rows_written: int, env_steps: int, num_envs: int) -> int:
    """The rows an actor's learner calls are scheduled by (`calls_due`): those written."""
    return rows_written

  def counted_inserts(self, before: int, after: int, floor: int) -> int:
    """Inserts between two counts that the sample/insert ratio counts: those past `floor`
    (replay's minimum size, in the caller's unit)."""
    return after - max(before, floor)

  def samples_per_insert(self, spec) -> float:
    """The ratio of rows sampled to rows inserted that the schedule keeps."""
    return float(spec.samples_per_insert)

  def rows_per_env_step(self) -> float:
    """Rows written per env step of one env."""
    return 1.0

  def steps_per_row(self) -> int:
    """Env steps of one env that a row spans (its observations come from as many)."""
    return 1

  def learner_workload(self, spec) -> Tuple[float, int]:
    """`launch.advise`'s workload: (rows sampled per env step, and the steps of items each sampled
    once by a call of one batch, else 0)."""
    return float(spec.samples_per_insert) * self.rows_per_env_step(), 0

  def items_lost_on_resume(self, written: int, consumed: int, table_size: Callable[[], int]) -> int:
    """Items a resumed Reverb run will never sample though the schedule counts them (none: a
    replayed item stays in the table)."""
    return 0

  # On device (`jrl.run.device.loop`): a window of the last steps emits rows into a ring.

  def device_layout(self, num_envs: int, batch_size: int, num_devices: int) -> DeviceLayout:
    """One vector step per iteration; its learner calls are scheduled (`device_call_schedule`)."""
    on_device.check_sizes(num_envs, batch_size, num_devices)
    return DeviceLayout(1, 1, 0, num_envs)

  def device_iteration(self, loop) -> Callable:
    """The loop's iteration for this kind: add a step's rows to the ring and make the calls due."""
    return loop.replay_iteration

  def device_init(self, spec, obs, action, extras: Extras) -> Tuple[Any, Any]:
    """(window, ring) for `obs` [N, ...] and `action` [N, ...] (zeros); `extras()` the shapes of
    what the policy reports for N envs."""
    n = obs.shape[0]
    zeros = self._window_extras(extras)
    window = self._window_init(obs, action, zeros)
    _, row, _ = self._window_add(window, obs, action, jnp.zeros(n), jnp.zeros(n, bool), jnp.zeros(n, bool), obs, zeros)
    return window, on_device.ring_init(row, max(1, spec.max_size // n), spec.prioritized)

  def device_add(self, window, obs, action, step, extras: Dict[str, Any]) -> Tuple[Any, Any, Any]:
    """Adds one vector step (`step` the env's StepResult, `extras` the policy's; rewards clipped
    here as the host's adder clips them); returns (window, the rows [N, ...] it emits, whether
    they are due [])."""
    return self._window_add(window, obs, action, self._clip_on_device(step.reward), step.terminated,
                            step.truncated, step.final_observation, extras)

  def _clip_on_device(self, reward):
    return jnp.clip(reward, -self.reward_clip, self.reward_clip) if self.reward_clip > 0 else reward

  def _window_extras(self, extras: Extras) -> Dict[str, Any]:
    """Zeros of the extras the window keeps (none)."""
    return {}

  def _window_init(self, obs, action, extras: Dict[str, Any]) -> Any:
    raise NotImplementedError

  def _window_add(self, window, obs, action, reward, terminated, truncated, next_obs, extras: Dict[str, Any]):
    raise NotImplementedError

  def device_rows_written(self, vector_steps, num_envs: int):
    """Rows the window has emitted after `vector_steps` steps (exact integers; an int or an
    integer array of step counts)."""
    raise NotImplementedError

  def device_call_schedule(self, spec, vector_steps: int, iterations: int, steps_per_iteration: int,
                           num_envs: int, samples_per_call: int) -> np.ndarray:
    """[iterations] int32: learner calls due at each iteration of a chunk that starts after
    `vector_steps` steps, by `calls_due` on the rows emitted (as the host counts them)."""
    steps = vector_steps + steps_per_iteration * np.arange(iterations + 1, dtype=np.int64)
    rows = np.asarray(self.device_rows_written(steps, num_envs), np.int64)
    if type(self).calls_due is not ItemKind.calls_due:  # a kind's own rule, as it wrote it
      owed = np.asarray([self.calls_due(spec, int(r), samples_per_call) for r in rows], np.int64)
    else:  # `calls_due` on every count at once: the same float64 (or int) operations, elementwise
      owed = np.where(rows < spec.min_size, 0,
                      (rows - spec.min_size) * spec.samples_per_insert // samples_per_call + 1).astype(np.int64)
    return np.diff(owed).astype(np.int32)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Transitions(ItemKind):
  """n-step transitions (o_t, a_t, sum_{k<n} gamma^k r_{t+k+1}, gamma^n or 0, o_{t+n}) in blocks of
  `spec.block_size`; the learner's batches are dealt from several sampled blocks at once."""
  n_step: int = 1          # rewards summed before bootstrapping
  discount: float = 0.99   # gamma

  row_type: ClassVar[type] = Transition

  def __post_init__(self):
    require_positive(self, "n_step")
    require_unit_interval(self, "discount")
    super().__post_init__()

  def _adder(self, num_envs: int) -> NStepTransitionAdder:
    return NStepTransitionAdder(num_envs, self.n_step, self.discount)

  def steps_per_row(self) -> int:
    return self.n_step

  def make_block_writer(self, spec, writer) -> BlockWriter:
    return BlockWriter(writer, spec.block_size, row_type=self.row_type)

  def example_row(self, step: Transition, extras: Extras) -> Transition:
    return step

  def example_item(self, spec, step: Transition, extras: Extras) -> Transition:
    return Transition(*[np.zeros((spec.block_size,) + np.shape(x), np.asarray(x).dtype) for x in step])

  def items_per_fetch(self, spec, updates_per_call: int, batch_size: int) -> int:
    return items_per_call(updates_per_call, batch_size, spec.block_size)

  def make_assembler(self, spec, updates_per_call: int, batch_size: int,
                     rng: np.random.Generator) -> Callable:
    importance = spec.importance_exponent if spec.prioritized else None
    return lambda sampled: assemble(sampled, updates_per_call, batch_size, importance, rng)

  def rows_scheduled(self, spec, rows_written: int, env_steps: int, num_envs: int) -> int:
    """Env steps less the transitions the adder and block writer may still hold back (open
    n-step windows, a partial block): rows sure to be in replay, so that every learner process
    of a multi-process run makes the same calls."""
    return env_steps - (num_envs * (self.n_step - 1) + spec.block_size - 1)

  def _window_init(self, obs, action, extras: Dict[str, Any]):
    return on_device.window_init(self.n_step, obs, action)

  def _window_add(self, window, obs, action, reward, terminated, truncated, next_obs, extras: Dict[str, Any]):
    return on_device.window_add(window, obs, action, reward, terminated, truncated, next_obs,
                                    float(self.discount))

  def device_rows_written(self, vector_steps, num_envs: int):
    """A transition per env and step, each emitted n - 1 steps late."""
    return np.maximum(0, vector_steps - (self.n_step - 1)) * num_envs


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrajectoryQueue(ItemKind):
  """On-policy trajectories of `sequence_length` steps (`jrl.types.Trajectory`, the policy's extras
  kept) in a FIFO queue; a learner call takes one batch of the oldest, each used once."""
  sequence_length: int     # steps per trajectory

  sampled_once: ClassVar[bool] = True
  row_type: ClassVar[type] = Trajectory

  def __post_init__(self):
    require_positive(self, "sequence_length")
    super().__post_init__()

  def _adder(self, num_envs: int) -> SequenceAdder:
    return SequenceAdder(num_envs, self.sequence_length)

  def example_row(self, step: Transition, extras: Extras) -> Trajectory:
    stack = lambda x: np.zeros((self.sequence_length,) + np.shape(x), np.asarray(x).dtype)
    scalar = np.float32(0)
    return Trajectory(stack(step.observation), stack(step.action), stack(scalar), stack(scalar), stack(scalar),
                      stack(step.next_observation), {k: stack(v) for k, v in extras().items()})

  def updates_per_call(self, requested: int) -> int:
    """One: each batch of trajectories is trained on by its own call, as it comes."""
    return 1

  def make_assembler(self, spec, updates_per_call: int, batch_size: int,
                     rng: np.random.Generator) -> Callable:
    return lambda sampled: assemble_sequence_batches(sampled, updates_per_call, batch_size, None)

  def calls_due(self, spec, rows: int, samples_per_call: int) -> int:
    """One call per `samples_per_call` trajectories written."""
    return rows // samples_per_call

  def counted_inserts(self, before: int, after: int, floor: int) -> int:
    return after - before

  def samples_per_insert(self, spec) -> float:
    return 1.0

  def rows_per_env_step(self) -> float:
    return 1.0 / self.sequence_length

  def steps_per_row(self) -> int:
    return self.sequence_length

  def learner_workload(self, spec) -> Tuple[float, int]:
    return 1.0, self.sequence_length

  def items_lost_on_resume(self, written: int, consumed: int, table_size: Callable[[], int]) -> int:
    """Trajectories the sampler had taken from the queue but not yet trained on: gone."""
    return max(0, written - consumed - table_size())

  def device_layout(self, num_envs: int, batch_size: int, num_devices: int) -> DeviceLayout:
    """Rollouts of `sequence_length` steps that fill whole batches, then a call per batch."""
    n, b = num_envs, batch_size
    if n % b and b % n:
      raise ConfigError("num_envs", f"and batch_size must divide one another for on-policy agents on the device "
                                    f"backend (rollouts fill whole batches), got {n} and {b}")
    rollouts = max(1, b // n)
    return DeviceLayout(rollouts, self.sequence_length, rollouts * n // b, rollouts * n * self.sequence_length)

  def device_iteration(self, loop) -> Callable:
    return loop.rollout_iteration

  def device_init(self, spec, obs, action, extras: Extras) -> Tuple[Any, Any]:
    return None, None  # rollouts go straight to the learner

  def device_add(self, window, obs, action, step, extras) -> Tuple[Any, Any, Any]:
    done = jnp.logical_or(step.terminated, step.truncated)
    row = Trajectory(obs, action, self._clip_on_device(step.reward), 1.0 - step.terminated.astype(jnp.float32),
                     done.astype(jnp.float32), step.final_observation, extras)
    return window, row, jnp.asarray(True)

  def device_call_schedule(self, spec, vector_steps: int, iterations: int, steps_per_iteration: int,
                           num_envs: int, samples_per_call: int) -> np.ndarray:
    """None scheduled: each iteration's rollouts make their own calls."""
    return np.zeros(iterations, np.int32)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReplayedSequences(ItemKind):
  """Overlapping sequences (`jrl.replay.sequence_adder.RecurrentSequence`): `sequence_length`
  steps, a new one every `sequence_period` steps of each env, with the policy's core state at
  their first step; the first `burn_in` steps only warm the core up (the learner's)."""
  sequence_length: int     # steps per sequence
  sequence_period: int     # steps between the starts of consecutive sequences (overlap = length - period)
  burn_in: int = 0         # leading steps that only warm the core up

  row_type: ClassVar[type] = RecurrentSequence

  def __post_init__(self):
    require_positive(self, "sequence_length", "sequence_period")
    require_non_negative(self, "burn_in")
    if self.sequence_length <= self.burn_in:
      raise ConfigError("sequence_length", f"must be > burn_in ({self.burn_in}), got {self.sequence_length}")
    if self.sequence_period > self.sequence_length:
      raise ConfigError("sequence_period", f"must be <= sequence_length ({self.sequence_length}), "
                                           f"got {self.sequence_period}")
    super().__post_init__()

  def _adder(self, num_envs: int) -> OverlappingSequenceAdder:
    return OverlappingSequenceAdder(num_envs, self.sequence_length, self.sequence_period)

  def example_row(self, step: Transition, extras: Extras):
    return example_sequence(step.observation, step.action, extras()[START_STATE_KEY], self.sequence_length)

  def rows_per_env_step(self) -> float:
    return 1.0 / self.sequence_period

  def steps_per_row(self) -> int:
    return self.sequence_length

  def _window_extras(self, extras: Extras) -> Dict[str, Any]:
    start = extras()[START_STATE_KEY]
    return {START_STATE_KEY: jnp.zeros(start.shape, start.dtype)}

  def _window_init(self, obs, action, extras: Dict[str, Any]):
    return on_device.sequence_window_init(self.sequence_length, obs, action, extras[START_STATE_KEY])

  def _window_add(self, window, obs, action, reward, terminated, truncated, next_obs, extras: Dict[str, Any]):
    return on_device.sequence_window_add(window, obs, action, reward, terminated, truncated, next_obs,
                                             extras[START_STATE_KEY], self.sequence_period)

  def device_rows_written(self, vector_steps, num_envs: int):
    return on_device.sequences_written(vector_steps, num_envs, self.sequence_length, self.sequence_period)


KINDS = (Transitions, TrajectoryQueue, ReplayedSequences)


def check_kind(kind: Any) -> ItemKind:
  """`kind` if it is an item kind; ConfigError('kind') naming the known ones otherwise."""
  if not isinstance(kind, ItemKind):
    raise ConfigError("kind", f"unknown replay item kind {kind!r}: name one of "
                              f"{', '.join(k.__name__ for k in KINDS)} (jrl.replay.kinds), or a subclass of ItemKind")
  return kind


def legacy_kind(sequence_length: int, replay_sequence_length: int, replay_sequence_period: int) -> Optional[ItemKind]:
  """The kind a ReplaySpec named with the fields it had before item kinds, or None (none named):
  `sequence_length` > 0 an on-policy queue, `replay_sequence_length` > 0 replayed sequences."""
  if sequence_length and replay_sequence_length:
    raise ConfigError("kind", "a spec names one item kind: sequence_length (a trajectory queue) or "
                              "replay_sequence_length (replayed sequences), not both")
  if sequence_length:
    return TrajectoryQueue(sequence_length=sequence_length)
  if replay_sequence_length:
    return ReplayedSequences(sequence_length=replay_sequence_length, sequence_period=replay_sequence_period)
  return None

