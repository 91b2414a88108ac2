"""Shared data types.

Conventions, stated once for the whole library:
- Batched data is batch-major: single steps are `[B, ...]`, sequences `[B, T, ...]`
  (a `Trajectory` batch). Functions over one sequence take `[T, ...]` (time leading,
  as rlax's do) and are `vmap`ped over B at the call site.
- A learner call consumes a stack of batches `[U, B, ...]` (U = updates per call,
  scanned over), e.g. `[U, B, T, ...]` for sequences.
- `discount` is the full multiplier of the bootstrap value: `gamma**k` for a
  k-step transition, and 0 once the episode terminated (truncation keeps it).
"""

from typing import Any, Callable, Dict, NamedTuple, Tuple

import jax

Array = jax.Array
Params = Any
PRNGKey = jax.Array
Metrics = Dict[str, Array]


class Transition(NamedTuple):
  """An n-step transition; every field carries the same leading batch dims."""
  observation: Array       # [..., *obs_shape] observation at t
  action: Array            # [..., *action_shape] action taken at t
  reward: Array            # [...] sum_{k<n} gamma^k r_{t+k+1}
  discount: Array          # [...] gamma^n, or 0 if the episode terminated inside
  next_observation: Array  # [..., *obs_shape] observation to bootstrap from


class Trajectory(NamedTuple):
  """A fixed-length piece of one env's experience; fields `[T, ...]` (stacked: `[B, T, ...]`).

  Episode boundaries may fall inside: at a step where the episode ended,
  `next_observation` is its true final observation and the next step starts
  the new episode.
  """
  observation: Array       # [T, *obs_shape]
  action: Array            # [T, *action_shape]
  reward: Array            # [T] r_{t+1}
  discount: Array          # [T] 0 where the episode terminated at this step, else 1 (gamma is the loss's)
  end_of_episode: Array    # [T] 1 where the episode ended here (terminated or truncated)
  next_observation: Array  # [T, *obs_shape]
  extras: Dict[str, Array]  # [T, ...] what the behaviour policy reported (log-probs, logits)


class LearnerBatch(NamedTuple):
  """What a learner's `update` consumes: transitions and importance weights."""
  transitions: Any         # Transition [B, ...] or Trajectory [B, T, ...]
  weights: Array           # [B] importance-sampling weights (1 for uniform replay)


class ActorState(NamedTuple):
  """Policy state of stateless (feed-forward) policies."""
  key: PRNGKey      # randomness of action sampling
  env_steps: Array  # [] int32 env steps taken (drives exploration schedules)


def initial_actor_state(key: PRNGKey, num_envs: int = 0) -> ActorState:
  del num_envs  # a feed-forward policy keeps nothing per env
  return ActorState(key, jax.numpy.zeros((), jax.numpy.int32))


class LearnerFns(NamedTuple):
  """`init(key) -> state`; `update(state, batch) -> (state, metrics)`, both pure.

  `metrics["priorities"]` ([B]), when present, holds new replay priorities.
  """
  init: Callable[[PRNGKey], Any]
  update: Callable[[Any, LearnerBatch], Tuple[Any, Metrics]]
  params: Callable[[Any], Params]  # the parameters a policy needs, from the state


class PolicyFns(NamedTuple):
  """A pure batched policy, feed-forward or recurrent (one contract for both).

  `init(key, num_envs) -> actor_state` for a batch of `num_envs` envs;
  `select_action(params, obs [B, ...], is_first [B] bool, actor_state) -> (action [B, ...], extras, actor_state)`.
  `is_first[i]` marks the first step of an episode in env i: a recurrent policy resets that
  env's core state there (and may report the state each step began from in `extras`);
  a feed-forward policy ignores it. `extras` are arrays [B, ...].
  """
  init: Callable[[PRNGKey, int], Any]
  select_action: Callable[[Params, Array, Array, Any], Tuple[Array, Dict[str, Array], Any]]


def as_named(cls: type, saved: Any) -> Any:
  """A NamedTuple of type `cls` from `saved`: the tuple itself, or a dict of its fields (a NamedTuple
  as a checkpoint keeps it: `jrl.experiment.checkpoint_formats`)."""
  return saved if isinstance(saved, cls) else cls(**saved)


def rebuild(template: Any, saved: Any) -> Any:
  """`saved` in the structure of `template` (a pytree of the same structure, its leaves anything):
  a checkpoint keeps NamedTuples as dicts of their fields and tuples as lists; the leaves of
  `saved` are taken as they are."""
  if isinstance(template, tuple) and hasattr(template, "_fields"):
    fields = saved if isinstance(saved, dict) else saved._asdict()
    return type(template)(**{f: rebuild(getattr(template, f), fields[f]) for f in template._fields})
  if isinstance(template, dict):
    return {k: rebuild(v, saved[k]) for k, v in template.items()}
  if isinstance(template, (list, tuple)):
    if len(saved) != len(template):
      raise ValueError(f"a saved sequence of {len(saved)} entries where {len(template)} are expected")
    return type(template)(rebuild(t, s) for t, s in zip(template, saved))
  return saved
