"""R2D2 learner: burn-in, double-Q n-step targets over sequences with value rescaling (rlax),
sequence priorities, a periodic target network.

Kapturowski et al., 2019, "Recurrent Experience Replay in Distributed Reinforcement Learning".
"""

from typing import Callable, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp
import optax
import rlax

from jrl.agents import modules
from jrl.agents.r2d2.config import Config
from jrl.agents.r2d2.networks import Networks, unroll
from jrl.replay.sequence_adder import RecurrentSequence, is_first
from jrl.types import Array, LearnerBatch, LearnerFns, Metrics, Params


class TrainingState(NamedTuple):
  params: Params
  target_params: Params
  opt_state: optax.OptState
  steps: Array  # [] int32 updates done


class LossOutput(NamedTuple):
  td: Array          # [T - burn_in, B] TD errors (in the rescaled space)
  priorities: Array  # [B] eta max|td| + (1 - eta) mean|td| per sequence
  q_mean: Array      # [] mean Q of the actions taken


def n_step_targets(reward: Array, discount: Array, end_of_episode: Array, v_next: Array, gamma: float, n: int,
                   rescale: bool) -> Array:
  """n-step return targets over one sequence [T] whose episodes may end inside it.

  `v_next[t]` is the bootstrap value of step t's own next observation (the true final one
  at an episode end). The trace is cut at every episode end (lambda_t = 0): a target
  never sums rewards of the next episode, bootstraps from the final observation on
  truncation and not at all on termination (discount 0). Near the sequence's end fewer
  than n steps remain and the last value is used (rlax pads). With `rescale`, values are
  in h-space: h^-1 before summing, h after (rlax's signed hyperbolic pair).
  """
  discount_t = gamma * discount
  lambda_t = 1.0 - end_of_episode
  if rescale:
    return rlax.transformed_n_step_returns(rlax.SIGNED_HYPERBOLIC_PAIR, reward, discount_t, v_next, n,
                                           lambda_t=lambda_t, stop_target_gradients=True)
  return rlax.n_step_bootstrapped_returns(reward, discount_t, v_next, n, lambda_t=lambda_t,
                                          stop_target_gradients=True)


def r2d2_loss(networks: Networks, params: Params, target_params: Params, batch: LearnerBatch,
              cfg: Config) -> Tuple[Array, LossOutput]:
  """The default loss: (scalar, LossOutput) for a batch of RecurrentSequence [B, T, ...].

  Both networks start from the stored core state and run over the first `burn_in` steps
  without gradient; the rest is trained. Double Q: the online network picks the
  bootstrap action, the target network values it.
  """
  start = batch.transitions.start_state                                                     # [B, S]
  seq: RecurrentSequence = jax.tree_util.tree_map(lambda x: jnp.swapaxes(x, 0, 1),
                                                  batch.transitions._replace(start_state=None))  # [T, B, ...]
  reset = is_first(seq.end_of_episode)
  k = cfg.burn_in
  online_start, target_start = start, start
  if k > 0:
    _, online_states = unroll(networks, params, seq.observation[:k], reset[:k], start)
    _, target_states = unroll(networks, target_params, seq.observation[:k], reset[:k], start)
    online_start, target_start = online_states[-1], target_states[-1]
  online_start = jax.lax.stop_gradient(online_start)
  part = jax.tree_util.tree_map(lambda x: x[k:], seq)
  q, states = unroll(networks, params, part.observation, reset[k:], online_start)               # [L, B, A]
  _, target_states = unroll(networks, target_params, part.observation, reset[k:], target_start)
  # Values of each step's own next observation, from the state after that step.
  next_apply = jax.vmap(networks.apply, in_axes=(None, 0, 0))
  q_next_online, _ = next_apply(params, part.next_observation, jax.lax.stop_gradient(states))
  q_next_target, _ = next_apply(target_params, part.next_observation, target_states)
  best = jnp.argmax(jax.lax.stop_gradient(q_next_online), axis=-1)
  v_next = jax.lax.stop_gradient(jnp.take_along_axis(q_next_target, best[..., None], axis=-1)[..., 0])
  targets = jax.vmap(n_step_targets, in_axes=(1, 1, 1, 1, None, None, None), out_axes=1)(
      part.reward, part.discount, part.end_of_episode, v_next, cfg.discount, cfg.n_step, cfg.value_rescaling)
  q_taken = jnp.take_along_axis(q, part.action.astype(jnp.int32)[..., None], axis=-1)[..., 0]
  td = targets - q_taken                                                                        # [L, B]
  loss = jnp.mean(batch.weights * jnp.mean(0.5 * td ** 2, axis=0))
  abs_td = jnp.abs(jax.lax.stop_gradient(td))
  priorities = cfg.priority_max_weight * abs_td.max(0) + (1 - cfg.priority_max_weight) * abs_td.mean(0)
  return loss, LossOutput(td, priorities, jnp.mean(q_taken))


LossFn = Callable[[Networks, Params, Params, LearnerBatch, Config], Tuple[Array, LossOutput]]


def make_optimizer(cfg: Config) -> optax.GradientTransformation:
  return modules.clipped_adam(cfg)


def make_learner(networks: Networks, cfg: Config, loss: Optional[LossFn] = None,
                 optimizer: Optional[optax.GradientTransformation] = None) -> LearnerFns:
  """`loss` (default `r2d2_loss`) and `optimizer` (default: clipped Adam) may be replaced."""
  loss = loss if loss is not None else r2d2_loss
  optimizer = optimizer if optimizer is not None else make_optimizer(cfg)

  def init(key) -> TrainingState:
    params = networks.init(key)
    return TrainingState(params, params, optimizer.init(params), jnp.zeros((), jnp.int32))

  def update(state: TrainingState, batch: LearnerBatch):
    grad_fn = jax.value_and_grad(lambda p: loss(networks, p, state.target_params, batch, cfg), has_aux=True)
    (value, out), grads = grad_fn(state.params)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    steps = state.steps + 1
    target_params = optax.periodic_update(params, state.target_params, steps, cfg.target_update_period)
    metrics: Metrics = {"loss": value, "td_abs_mean": jnp.mean(jnp.abs(out.td)), "q_mean": out.q_mean,
                        "grad_norm": optax.tree.norm(grads), "priorities": out.priorities}
    return TrainingState(params, target_params, opt_state, steps), metrics

  return LearnerFns(init=init, update=update, params=lambda state: state.params)
