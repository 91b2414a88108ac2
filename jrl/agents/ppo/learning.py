"""PPO learner: GAE advantages (rlax) and several epochs of clipped-surrogate minibatch updates per call."""

from typing import Callable, Dict, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp
import optax
import rlax

from jrl.agents import modules, on_policy
from jrl.agents.ppo.config import Config
from jrl.agents.ppo.networks import Networks
from jrl.types import Array, LearnerFns, Params, Trajectory


TrainingState = on_policy.TrainingState  # params, opt_state, key (minibatch shuffling), steps (learner calls)


def gae_advantages(reward: Array, discount: Array, end_of_episode: Array, value: Array, next_value: Array,
                   gamma: float, lambda_: float) -> Array:
  """GAE over one trajectory [T] whose episode boundaries may fall inside it.

  rlax's recursion uses `values[t + 1]` both to bootstrap step t and as the value
  of step t + 1; across an episode boundary these differ (the final observation
  vs the next episode's first). The reward is corrected by the difference, and
  the trace is cut at every episode end (lambda_t = 0) while termination alone
  stops bootstrapping (discount_t = 0).
  """
  discount_t = gamma * discount
  values = jnp.concatenate([value, next_value[-1:]])  # [T + 1]
  corrected_reward = reward + discount_t * (next_value - values[1:])
  lambda_t = lambda_ * (1.0 - end_of_episode)
  return rlax.truncated_generalized_advantage_estimation(corrected_reward, discount_t, lambda_t, values)


def clipped_policy_loss(log_prob: Array, behaviour_log_prob: Array, advantages: Array, epsilon: float) -> Array:
  """-mean(min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A)), ratio = pi / pi_behaviour."""
  ratio = jnp.exp(log_prob - behaviour_log_prob)
  return rlax.clipped_surrogate_pg_loss(ratio, advantages, epsilon)


class Minibatch(NamedTuple):
  """One minibatch of M = B * T / num_minibatches steps, flattened over trajectories and time."""
  observation: Array         # [M, *obs_shape]
  action: Array              # [M]
  behaviour_log_prob: Array  # [M] log-prob of the action under the policy that acted
  advantage: Array           # [M] GAE advantages (normalised in the loss if cfg.normalize_advantages)
  value_target: Array        # [M] advantage + value (the lambda-return)


def loss(networks: Networks, params: Params, data: Minibatch, cfg: Config) -> Tuple[Array, Dict[str, Array]]:
  """The default loss of one minibatch: clipped surrogate + value_cost x value MSE / 2 -
  entropy_cost x entropy. Returns (loss [], metrics {name: []})."""
  logits, value = networks.apply(params, data.observation)
  dist = networks.distribution(logits)
  log_prob = dist.log_prob(data.action)
  ratio = jnp.exp(log_prob - data.behaviour_log_prob)
  advantages = data.advantage
  if cfg.normalize_advantages:
    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
  policy_loss = clipped_policy_loss(log_prob, data.behaviour_log_prob, advantages, cfg.clip_epsilon)
  value_loss = 0.5 * jnp.mean(value_errors(value, data, cfg.value_clip_epsilon))
  entropy = jnp.mean(dist.entropy())
  total = policy_loss + cfg.value_cost * value_loss - cfg.entropy_cost * entropy
  return total, {"policy_loss": policy_loss, "value_loss": value_loss, "entropy": entropy,
                 "clip_fraction": jnp.mean(jnp.abs(ratio - 1.0) > cfg.clip_epsilon)}


def value_errors(value: Array, data: Minibatch, epsilon: float) -> Array:
  """Squared errors of `value` [M] against the lambda-returns. With epsilon > 0, the larger of that and
  the error of the value clipped to within epsilon of the one that made the targets (target -
  advantage): a step does not move the value far from it (PPO's value clipping)."""
  errors = (value - data.value_target) ** 2
  if isinstance(epsilon, (int, float)) and epsilon <= 0:
    return errors
  old_value = data.value_target - data.advantage
  clipped = old_value + jnp.clip(value - old_value, -epsilon, epsilon)
  # A vmapped sweep's grid may trace epsilon (0 among its values): off there is a select, not a branch.
  return jnp.where(epsilon > 0, jnp.maximum(errors, (clipped - data.value_target) ** 2), errors)


LossFn = Callable[[Networks, Params, Minibatch, Config], Tuple[Array, Dict[str, Array]]]
default_loss = loss


def make_optimizer(cfg: Config) -> optax.GradientTransformation:
  """The default optimiser: global-norm clipping, then Adam."""
  return modules.clipped_adam(cfg)


def make_learner(networks: Networks, cfg: Config, loss: Optional[LossFn] = None,
                 optimizer: Optional[optax.GradientTransformation] = None) -> LearnerFns:
  """Pure init and update; `loss` (see `loss`: one minibatch) and `optimizer` replace the defaults.

  update(state, batch): batch transitions a Trajectory [B, T, ...] -> (state, metrics); GAE
  over each trajectory, then num_epochs passes of num_minibatches minibatches.
  """
  loss_fn = default_loss if loss is None else loss
  optimizer = make_optimizer(cfg) if optimizer is None else optimizer

  def minibatch_loss(params, data: Minibatch):
    return loss_fn(networks, params, data, cfg)

  def prepare(params, traj: Trajectory):  # [B, T, ...] -> Minibatch [B * T, ...]
    _, value = jax.vmap(networks.apply, in_axes=(None, 0))(params, traj.observation)
    _, next_value = jax.vmap(networks.apply, in_axes=(None, 0))(params, traj.next_observation)
    advantage = jax.vmap(gae_advantages, in_axes=(0, 0, 0, 0, 0, None, None))(
        traj.reward, traj.discount, traj.end_of_episode, value, next_value, cfg.discount, cfg.gae_lambda)
    data = Minibatch(traj.observation, traj.action, traj.extras["log_prob"], advantage,
                     jax.lax.stop_gradient(advantage + value))
    data = jax.tree_util.tree_map(lambda x: jnp.asarray(x).reshape((-1,) + x.shape[2:]), data)  # [B * T, ...]
    return data, {"advantage_mean": jnp.mean(advantage)}

  return on_policy.make_minibatch_learner(networks.init, minibatch_loss, optimizer, prepare, cfg.num_epochs,
                                          cfg.num_minibatches)
