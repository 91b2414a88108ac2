"""Shared data types.

Conventions, stated once for the whole library:
- Batched data is time-major: sequences are `[T, B, ...]`, single steps `[B, ...]`.
- A learner call consumes a stack of batches `[U, B, ...]` (U = updates per call).
- `discount` is the full multiplier of the bootstrap value: `gamma**k` for a
  k-step transition, and 0 once the episode terminated (truncation keeps it).
"""

from typing import Any, Callable, Dict, NamedTuple, Protocol, Tuple

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


class LearnerBatch(NamedTuple):
  """What a learner's `update` consumes: transitions and importance weights."""
  transitions: Transition  # [B, ...]
  weights: Array           # [B] importance-sampling weights (1 for uniform replay)


class InitFn(Protocol):
  def __call__(self, key: PRNGKey) -> Any:
    ...


class LearnerFns(NamedTuple):
  """`init(key) -> state`; `update(state, batch) -> (state, metrics)`, both pure.

  `metrics["priorities"]` ([B]), when present, holds new replay priorities.
  """
  init: Callable[[PRNGKey], Any]
  update: Callable[[Any, LearnerBatch], Tuple[Any, Metrics]]
  params: Callable[[Any], Params]  # the parameters a policy needs, from the state


class PolicyFns(NamedTuple):
  """A pure batched policy.

  `init(key) -> actor_state`;
  `select_action(params, obs [B, ...], actor_state) -> (action [B, ...], extras, actor_state)`.
  """
  init: Callable[[PRNGKey], Any]
  select_action: Callable[[Params, Array, Any], Tuple[Array, Dict[str, Array], Any]]
