"""Pieces shared by the agents that learn from the on-policy trajectory queue: its replay spec
(PPO, PQN, IMPALA), and for those that run epochs of shuffled minibatches over each learner
call's trajectories (PPO, PQN): the config check of the minibatch split, the training state,
the epochs themselves and the learner built on them."""

from typing import Any, Callable, Dict, NamedTuple, Tuple

import jax
import jax.numpy as jnp
import optax

from jrl.errors import ConfigError
from jrl.replay.kinds import TrajectoryQueue
from jrl.replay.spec import ReplaySpec
from jrl.types import Array, LearnerBatch, LearnerFns, Params, PRNGKey, Trajectory


def trajectory_queue_spec(sequence_length: int, batch_size: int, reward_clip: float) -> ReplaySpec:
  """A queue of a few calls' worth of trajectories of `sequence_length` steps (4 x `batch_size`);
  each is used by exactly one learner call. Validates `sequence_length` and `reward_clip` (the
  item kind's fields)."""
  return ReplaySpec(kind=TrajectoryQueue(sequence_length=sequence_length, reward_clip=reward_clip),
                    block_size=1, max_size=4 * batch_size, min_size=1, samples_per_insert=1.0)


def check_num_minibatches(batch_size: int, sequence_length: int, num_minibatches: int) -> None:
  """ConfigError('num_minibatches', ...) unless it divides the steps of one learner call,
  batch_size x sequence_length."""
  if (batch_size * sequence_length) % num_minibatches:
    raise ConfigError("num_minibatches", f"must divide batch_size x sequence_length "
                                         f"({batch_size * sequence_length}), got {num_minibatches}")


MinibatchLoss = Callable[[Params, Any], Tuple[Array, Dict[str, Array]]]


def epochs_of_minibatches(loss_fn: MinibatchLoss, optimizer: optax.GradientTransformation, params: Params,
                          opt_state: optax.OptState, key: PRNGKey, data: Any, num_epochs: int,
                          num_minibatches: int, with_grad_norm: bool = False
                          ) -> Tuple[Params, optax.OptState, PRNGKey, Dict[str, Array]]:
  """`num_epochs` passes over `data`, each in `num_minibatches` minibatches of a fresh permutation:
  one gradient step of `optimizer` on `loss_fn` per minibatch. Pure (scans; jit it with the caller).

  data: a pytree of arrays [N, ...] (N steps, flattened over trajectories and time), N divisible
  by num_minibatches; each minibatch is the same pytree [N / num_minibatches, ...].
  loss_fn(params, minibatch) -> (loss [], metrics {name: []}).
  key: split once per epoch (the permutation takes the second half).
  Returns (params, opt_state, key, metrics {name: []}): each metric's mean over the num_epochs x
  num_minibatches steps; with `with_grad_norm`, also `grad_norm`, the global norm of each step's
  gradients (before the optimizer's clipping).
  """
  num = jax.tree_util.tree_leaves(data)[0].shape[0]

  def epoch(carry, _):
    params, opt_state, key = carry
    key, perm_key = jax.random.split(key)
    order = jax.random.permutation(perm_key, num).reshape(num_minibatches, -1)

    def minibatch(carry, indices):
      params, opt_state = carry
      (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
          params, jax.tree_util.tree_map(lambda x: x[indices], data))
      updates, opt_state = optimizer.update(grads, opt_state, params)
      if with_grad_norm:
        metrics = {**metrics, "grad_norm": optax.tree.norm(grads)}
      return (optax.apply_updates(params, updates), opt_state), metrics

    (params, opt_state), metrics = jax.lax.scan(minibatch, (params, opt_state), order)
    return (params, opt_state, key), metrics

  (params, opt_state, key), metrics = jax.lax.scan(epoch, (params, opt_state, key), None, length=num_epochs)
  return params, opt_state, key, jax.tree_util.tree_map(jnp.mean, metrics)



class TrainingState(NamedTuple):
  params: Params
  opt_state: optax.OptState
  key: PRNGKey   # minibatch shuffling
  steps: Array   # [] int32 learner calls


Prepare = Callable[[Params, Trajectory], Tuple[Any, Dict[str, Array]]]


def make_minibatch_learner(init_params: Callable[[PRNGKey], Params], loss_fn: MinibatchLoss,
                           optimizer: optax.GradientTransformation, prepare: Prepare, num_epochs: int,
                           num_minibatches: int, with_grad_norm: bool = False) -> LearnerFns:
  """Pure init and update of a `TrainingState`.

  init(key): `init_params` on the first half of a split of key, the second shuffles minibatches.
  update(state, batch): batch transitions a Trajectory [B, T, ...];
  `prepare(params, trajectory) -> (data [N = B * T, ...], metrics {name: []})` with the
  parameters before the call, then `epochs_of_minibatches` of `loss_fn` over data. Metrics: the
  minibatches' means (see `epochs_of_minibatches`) and those of `prepare`.
  """

  def init(key) -> TrainingState:
    params_key, key = jax.random.split(key)
    params = init_params(params_key)
    return TrainingState(params, optimizer.init(params), key, jnp.zeros((), jnp.int32))

  def update(state: TrainingState, batch: LearnerBatch):
    data, call_metrics = prepare(state.params, batch.transitions)
    params, opt_state, key, metrics = epochs_of_minibatches(
        loss_fn, optimizer, state.params, state.opt_state, state.key, data, num_epochs, num_minibatches,
        with_grad_norm)
    return TrainingState(params, opt_state, key, state.steps + 1), {**metrics, **call_metrics}

  return LearnerFns(init=init, update=update, params=lambda state: state.params)
