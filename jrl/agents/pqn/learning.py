"""PQN learner: Q(lambda) targets from the current parameters (no target network), then several
epochs of minibatch Q-regression per call (Gallici et al., 2024)."""

from typing import Callable, Dict, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp
import optax

from jrl.agents import modules, on_policy
from jrl.agents.pqn.config import Config
from jrl.agents.pqn.networks import Networks
from jrl.types import Array, LearnerFns, Params, Trajectory


TrainingState = on_policy.TrainingState  # params, opt_state, key (minibatch shuffling), steps (learner calls)


def q_lambda_targets(reward: Array, discount: Array, end_of_episode: Array, next_q_max: Array,
                     gamma: float, lambda_: float) -> Array:
  """Q(lambda) targets [T] over one trajectory [T] whose episode boundaries may fall inside it.

  `G_t = r_t + gamma d_t ((1 - lambda_t) q_t + lambda_t G_{t+1})`, where `q_t = max_a Q(o'_t, a)`
  (`next_q_max`) of step t's next observation (at an episode end: its true final one),
  `d_t` = `discount` (0 where the episode terminated), `lambda_t = lambda_ (1 - end_of_episode_t)`,
  and `lambda_{T-1} = 0`: the last step bootstraps fully from `q_{T-1}`. Termination stops
  bootstrapping; truncation cuts the trace and bootstraps from the final observation.
  """
  reward, discount, next_q_max = (jnp.asarray(x, jnp.float32) for x in (reward, discount, next_q_max))
  lambda_t = lambda_ * (1.0 - jnp.asarray(end_of_episode, jnp.float32))
  lambda_t = lambda_t.at[-1].set(0.0)

  def step(g_next, x):
    r, d, lam, q = x
    g = r + gamma * d * ((1.0 - lam) * q + lam * g_next)
    return g, g

  _, targets = jax.lax.scan(step, jnp.zeros_like(reward[-1]), (reward, discount, lambda_t, next_q_max),
                            reverse=True)
  return targets


class Minibatch(NamedTuple):
  """One minibatch of M = B * T / num_minibatches steps, flattened over trajectories and time."""
  observation: Array  # [M, *obs_shape]
  action: Array       # [M]
  target: Array       # [M] Q(lambda) target (no gradient)


def loss(networks: Networks, params: Params, data: Minibatch, cfg: Config) -> Tuple[Array, Dict[str, Array]]:
  """The default loss of one minibatch: 0.5 mean((Q(o, a) - G)^2). Returns (loss [], metrics
  {name: []})."""
  del cfg
  q = networks.apply(params, data.observation)
  q_a = jnp.take_along_axis(q, data.action.astype(jnp.int32)[:, None], axis=-1)[:, 0]
  value = 0.5 * jnp.mean((q_a - data.target) ** 2)
  return value, {"loss": value, "q_mean": jnp.mean(q_a), "target_mean": jnp.mean(data.target)}


LossFn = Callable[[Networks, Params, Minibatch, Config], Tuple[Array, Dict[str, Array]]]
default_loss = loss


def make_optimizer(cfg: Config) -> optax.GradientTransformation:
  """The default optimiser: global-norm clipping, then Adam."""
  return modules.clipped_adam(cfg)


def make_learner(networks: Networks, cfg: Config, loss: Optional[LossFn] = None,
                 optimizer: Optional[optax.GradientTransformation] = None) -> LearnerFns:
  """Pure init and update; `loss` (see `loss`: one minibatch) and `optimizer` replace the defaults.

  update(state, batch): batch transitions a Trajectory [B, T, ...] -> (state, metrics);
  `q_lambda_targets` over each trajectory from the current parameters (held fixed for the
  call), then num_epochs passes of num_minibatches shuffled minibatches.
  """
  loss_fn = default_loss if loss is None else loss
  optimizer = make_optimizer(cfg) if optimizer is None else optimizer

  def minibatch_loss(params, data: Minibatch):
    return loss_fn(networks, params, data, cfg)

  def prepare(params, traj: Trajectory):  # [B, T, ...] -> Minibatch [B * T, ...]
    b, t = traj.reward.shape[:2]
    flat = lambda x: jnp.asarray(x).reshape((b * t,) + x.shape[2:])
    next_q = networks.apply(params, flat(traj.next_observation))  # [B * T, A]
    next_q_max = jax.lax.stop_gradient(jnp.max(next_q, axis=-1).reshape(b, t))
    targets = jax.vmap(q_lambda_targets, in_axes=(0, 0, 0, 0, None, None))(
        traj.reward, traj.discount, traj.end_of_episode, next_q_max, cfg.discount, cfg.q_lambda)
    return Minibatch(flat(traj.observation), flat(traj.action), targets.reshape(b * t)), {}

  return on_policy.make_minibatch_learner(networks.init, minibatch_loss, optimizer, prepare, cfg.num_epochs,
                                          cfg.num_minibatches, with_grad_norm=True)
