"""DQN learner: pure init and update.

Double Q-learning (van Hasselt et al., 2016), or the target network's max (Mnih et al.,
2015) with `double_q=False`, on n-step transitions, Huber loss,
importance weights for prioritized replay (Schaul et al., 2016), periodic or
Polyak target updates.
"""

from typing import Callable, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp
import optax
import rlax

from jrl.agents import modules
from jrl.agents.dqn.config import Config
from jrl.agents.dqn.networks import Networks
from jrl.types import Array, LearnerBatch, LearnerFns, Params


class TrainingState(NamedTuple):
  params: Params
  target_params: Params
  opt_state: optax.OptState
  steps: Array  # [] int32 updates done


def td_errors(networks: Networks, params: Params, target_params: Params, batch: LearnerBatch,
              double_q: bool = True) -> Array:
  """n-step TD errors [B]; `discount` already holds gamma^n (0 at termination). The next
  action is the online net's argmax valued by the target net (double Q), or with
  `double_q=False` the target net's max."""
  t = batch.transitions
  q_tm1 = networks.apply(params, t.observation)
  q_t_value = networks.apply(target_params, t.next_observation)
  action = t.action.astype(jnp.int32)
  if not double_q:
    return jax.vmap(rlax.q_learning)(q_tm1, action, t.reward, t.discount, q_t_value)
  q_t_selector = networks.apply(params, t.next_observation)
  return jax.vmap(rlax.double_q_learning)(q_tm1, action, t.reward, t.discount, q_t_value, q_t_selector)


def loss(networks: Networks, params: Params, target_params: Params, batch: LearnerBatch,
         cfg: Config) -> Tuple[Array, Array]:
  """The default loss: mean of importance weight x Huber(n-step TD error), double Q as `cfg.double_q` says.

  batch: transitions [B, ...], weights [B]. Returns (loss [], td [B]); a custom loss keeps
  this signature and returns the TD errors as aux (they give the priorities and `td_abs_mean`).
  """
  td = td_errors(networks, params, target_params, batch, cfg.double_q)
  return jnp.mean(batch.weights * rlax.huber_loss(td, cfg.huber_delta)), td


LossFn = Callable[[Networks, Params, Params, LearnerBatch, Config], Tuple[Array, Array]]
default_loss = loss


def make_optimizer(cfg: Config) -> optax.GradientTransformation:
  """The default optimiser: global-norm clipping, then Adam."""
  return modules.clipped_adam(cfg)


def make_learner(networks: Networks, cfg: Config, loss: Optional[LossFn] = None,
                 optimizer: Optional[optax.GradientTransformation] = None) -> LearnerFns:
  """Pure init and update; `loss` (see `loss`) and `optimizer` replace the defaults.

  update(state, batch): batch transitions [B, ...], weights [B] -> (state, metrics), where
  metrics["priorities"] [B] are |TD| for prioritized replay.
  """
  loss_fn = default_loss if loss is None else loss
  optimizer = make_optimizer(cfg) if optimizer is None else optimizer

  def init(key) -> TrainingState:
    params = networks.init(key)
    return TrainingState(params, params, optimizer.init(params), jnp.zeros((), jnp.int32))

  def objective(params, target_params, batch: LearnerBatch):
    return loss_fn(networks, params, target_params, batch, cfg)

  def update(state: TrainingState, batch: LearnerBatch):
    (value, td), grads = jax.value_and_grad(objective, has_aux=True)(state.params, state.target_params, batch)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    steps = state.steps + 1
    if cfg.target_update_tau > 0:
      target_params = optax.incremental_update(params, state.target_params, cfg.target_update_tau)
    else:
      target_params = optax.periodic_update(params, state.target_params, steps, cfg.target_update_period)
    metrics = {"loss": value, "td_abs_mean": jnp.mean(jnp.abs(td)),
               "grad_norm": optax.tree.norm(grads), "priorities": jnp.abs(td)}
    return TrainingState(params, target_params, opt_state, steps), metrics

  return LearnerFns(init=init, update=update, params=lambda state: state.params)
