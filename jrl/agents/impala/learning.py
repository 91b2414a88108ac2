"""IMPALA learner: V-trace targets (rlax) and the actor-critic loss, one update per batch of trajectories."""

from typing import Callable, Dict, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp
import optax
import rlax

from jrl.agents.impala.config import Config
from jrl.agents.actor_critic import Networks
from jrl.types import Array, LearnerBatch, LearnerFns, Params, Trajectory


class TrainingState(NamedTuple):
  params: Params
  opt_state: optax.OptState
  steps: Array  # [] int32


class VTraceOutput(NamedTuple):
  errors: Array        # [T] vs_t - V(x_t)
  pg_advantage: Array  # [T] clipped rho_t (r_t + gamma v_{s,t+1} - V(x_t))


def vtrace(value: Array, next_value: Array, reward: Array, discount: Array, end_of_episode: Array, rho: Array,
           gamma: float, lambda_: float, clip_rho: float, clip_pg_rho: float) -> VTraceOutput:
  """V-trace over one trajectory [T] whose episode boundaries may fall inside it.

  `next_value[t]` is V of step t's own next observation (the true final one at
  an episode end), so bootstrapping is exact; traces are cut at every episode
  end (lambda_t = 0) and termination stops bootstrapping (discount 0). The value
  targets come from rlax.vtrace; the policy-gradient advantages bootstrap from
  the next step's target within an episode, and from `next_value` at its end.
  """
  discount_t = gamma * discount
  lambda_t = lambda_ * (1.0 - end_of_episode)
  errors = rlax.vtrace(value, next_value, reward, discount_t, rho, lambda_t, clip_rho_threshold=clip_rho)
  vs = errors + value
  next_vs = jnp.concatenate([vs[1:], next_value[-1:]])
  bootstrap = jnp.where(end_of_episode > 0, next_value, next_vs)
  bootstrap = bootstrap.at[-1].set(next_value[-1])
  pg_advantage = jnp.minimum(clip_pg_rho, rho) * (reward + discount_t * bootstrap - value)
  return VTraceOutput(errors, jax.lax.stop_gradient(pg_advantage))


def loss(networks: Networks, params: Params, traj: Trajectory, cfg: Config) -> Tuple[Array, Dict[str, Array]]:
  """The default loss over trajectories [B, T, ...]: V-trace policy gradient + baseline_cost x
  value MSE / 2 - entropy_cost x entropy. Returns (loss [], metrics {name: []})."""
  apply = jax.vmap(networks.apply, in_axes=(None, 0))
  logits, value = apply(params, traj.observation)            # [B, T, A], [B, T]
  _, next_value = apply(params, traj.next_observation)
  pi = networks.distribution(logits)
  mu = networks.distribution(traj.extras["logits"])
  rho = jnp.exp(pi.log_prob(traj.action) - mu.log_prob(traj.action))
  out = jax.vmap(vtrace, in_axes=(0, 0, 0, 0, 0, 0, None, None, None, None))(
      value, jax.lax.stop_gradient(next_value), traj.reward, traj.discount, traj.end_of_episode,
      jax.lax.stop_gradient(rho), cfg.discount, cfg.vtrace_lambda, cfg.clip_rho_threshold,
      cfg.clip_pg_rho_threshold)
  policy_loss = -jnp.mean(pi.log_prob(traj.action) * out.pg_advantage)
  baseline_loss = 0.5 * jnp.mean(out.errors ** 2)
  entropy = jnp.mean(pi.entropy())
  total = policy_loss + cfg.baseline_cost * baseline_loss - cfg.entropy_cost * entropy
  return total, {"policy_loss": policy_loss, "baseline_loss": baseline_loss, "entropy": entropy,
                 "rho_mean": jnp.mean(rho)}


LossFn = Callable[[Networks, Params, Trajectory, Config], Tuple[Array, Dict[str, Array]]]
default_loss = loss


def make_optimizer(cfg: Config) -> optax.GradientTransformation:
  """The default optimiser: global-norm clipping, then Adam."""
  return optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), optax.adam(cfg.learning_rate))


def make_learner(networks: Networks, cfg: Config, loss: Optional[LossFn] = None,
                 optimizer: Optional[optax.GradientTransformation] = None) -> LearnerFns:
  """Pure init and update; `loss` (see `loss`) and `optimizer` replace the defaults.

  update(state, batch): batch transitions a Trajectory [B, T, ...] -> (state, metrics).
  """
  loss_fn = default_loss if loss is None else loss
  optimizer = make_optimizer(cfg) if optimizer is None else optimizer

  def init(key) -> TrainingState:
    params = networks.init(key)
    return TrainingState(params, optimizer.init(params), jnp.zeros((), jnp.int32))

  def objective(params, traj: Trajectory):
    return loss_fn(networks, params, traj, cfg)

  def update(state: TrainingState, batch: LearnerBatch):
    traj = jax.tree_util.tree_map(jnp.asarray, batch.transitions)  # [B, T, ...]
    (value, metrics), grads = jax.value_and_grad(objective, has_aux=True)(state.params, traj)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    metrics["loss"] = value
    return TrainingState(optax.apply_updates(state.params, updates), opt_state, state.steps + 1), metrics

  return LearnerFns(init=init, update=update, params=lambda state: state.params)
