"""SAC learner: pure init and update (Haarnoja et al., 2018, "Soft Actor-Critic Algorithms and Applications")."""

from typing import Callable, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp
import optax

from jrl.agents.sac.config import Config
from jrl.agents.sac.networks import Networks, tanh_gaussian
from jrl.types import Array, LearnerBatch, LearnerFns, Params, PRNGKey


class TrainingState(NamedTuple):
  policy_params: Params
  q_params: Params
  target_q_params: Params
  log_alpha: Array          # [] log temperature
  policy_opt_state: optax.OptState
  q_opt_state: optax.OptState
  alpha_opt_state: optax.OptState
  key: PRNGKey              # for the actions sampled inside the update
  steps: Array              # [] int32


def temperature_loss(log_alpha: Array, log_prob: Array, target_entropy: float) -> Array:
  """-log(alpha) * (log pi(a|s) + target entropy), averaged; log pi held fixed."""
  return -jnp.mean(log_alpha * jax.lax.stop_gradient(log_prob + target_entropy))


def sample_actions(networks: Networks, policy_params: Params, obs: Array, key: PRNGKey) -> Tuple[Array, Array]:
  """Actions [B, A] in [-1, 1] sampled from the tanh-Gaussian, and their log-probs [B]."""
  dist = tanh_gaussian(*networks.policy_apply(policy_params, obs))
  return dist.sample_and_log_prob(seed=key)


def critic_loss(networks: Networks, q_params: Params, state: "TrainingState", batch: LearnerBatch, key: PRNGKey,
                cfg: Config) -> Tuple[Array, Array]:
  """The default critic loss: importance-weighted squared soft Bellman errors of both critics, / 2.

  batch: transitions [B, ...] (actions in the env's bounds), weights [B]. Returns (loss [], mean q [])."""
  t = batch.transitions
  next_action, next_log_prob = sample_actions(networks, state.policy_params, t.next_observation, key)
  next_q = networks.q_apply(state.target_q_params, t.next_observation, next_action).min(axis=0)
  alpha = jnp.exp(state.log_alpha)
  target = jax.lax.stop_gradient(t.reward + t.discount * (next_q - alpha * next_log_prob))
  q = networks.q_apply(q_params, t.observation, networks.from_env(t.action))
  loss = 0.5 * jnp.mean(batch.weights * ((q - target[None]) ** 2).sum(axis=0))
  return loss, q.mean()


def actor_loss(networks: Networks, policy_params: Params, q_params: Params, log_alpha: Array, obs: Array,
               key: PRNGKey, cfg: Config) -> Tuple[Array, Array]:
  """The default actor loss: mean(alpha log pi(a|s) - min_i Q_i(s, a)), a ~ pi, obs [B, ...].
  Returns (loss [], log pi [B]) (the log-probs drive the temperature loss)."""
  del cfg
  action, log_prob = sample_actions(networks, policy_params, obs, key)
  q = networks.q_apply(q_params, obs, action).min(axis=0)
  return jnp.mean(jnp.exp(log_alpha) * log_prob - q), log_prob


class Losses(NamedTuple):
  """SAC's three losses; replace any of them, e.g. `sac.Losses(critic=my_critic_loss)`."""
  critic: Callable[..., Tuple[Array, Array]] = critic_loss
  actor: Callable[..., Tuple[Array, Array]] = actor_loss
  temperature: Callable[[Array, Array, float], Array] = temperature_loss


def make_learner(networks: Networks, cfg: Config, loss: Optional[Losses] = None,
                 optimizer: Optional[optax.GradientTransformation] = None) -> LearnerFns:
  """Pure init and update; `loss` (a `Losses`) replaces the default losses, `optimizer` (one
  optax transformation, each part its own state) the three Adams of the actor, critics and temperature.

  update(state, batch): batch transitions [B, ...], weights [B] -> (state, metrics).
  """
  losses = Losses() if loss is None else loss
  action_dim = networks.action_low.shape[0]
  target_entropy = -float(action_dim) if cfg.target_entropy is None else cfg.target_entropy
  policy_opt = optax.adam(cfg.actor_learning_rate) if optimizer is None else optimizer
  q_opt = optax.adam(cfg.critic_learning_rate) if optimizer is None else optimizer
  alpha_opt = optax.adam(cfg.temperature_learning_rate) if optimizer is None else optimizer

  def init(key) -> TrainingState:
    policy_key, q_key, key = jax.random.split(key, 3)
    policy_params = networks.policy_init(policy_key)
    q_params = networks.q_init(q_key)
    log_alpha = jnp.asarray(jnp.log(cfg.initial_temperature), jnp.float32)
    return TrainingState(policy_params, q_params, q_params, log_alpha, policy_opt.init(policy_params),
                         q_opt.init(q_params), alpha_opt.init(log_alpha), key, jnp.zeros((), jnp.int32))

  def critic_objective(q_params, state: TrainingState, batch: LearnerBatch, key):
    return losses.critic(networks, q_params, state, batch, key, cfg)

  def actor_objective(policy_params, q_params, log_alpha, obs, key):
    return losses.actor(networks, policy_params, q_params, log_alpha, obs, key, cfg)

  def update(state: TrainingState, batch: LearnerBatch):
    key, critic_key, actor_key = jax.random.split(state.key, 3)
    (q_loss, q_mean), q_grads = jax.value_and_grad(critic_objective, has_aux=True)(state.q_params, state, batch,
                                                                                    critic_key)
    q_updates, q_opt_state = q_opt.update(q_grads, state.q_opt_state, state.q_params)
    q_params = optax.apply_updates(state.q_params, q_updates)

    obs = batch.transitions.observation
    (pi_loss, log_prob), pi_grads = jax.value_and_grad(actor_objective, has_aux=True)(
        state.policy_params, q_params, state.log_alpha, obs, actor_key)
    pi_updates, policy_opt_state = policy_opt.update(pi_grads, state.policy_opt_state, state.policy_params)
    policy_params = optax.apply_updates(state.policy_params, pi_updates)

    alpha_loss, alpha_grad = jax.value_and_grad(losses.temperature)(state.log_alpha, log_prob, target_entropy)
    alpha_updates, alpha_opt_state = alpha_opt.update(alpha_grad, state.alpha_opt_state, state.log_alpha)
    log_alpha = optax.apply_updates(state.log_alpha, alpha_updates)

    target_q_params = optax.incremental_update(q_params, state.target_q_params, cfg.tau)
    new_state = TrainingState(policy_params, q_params, target_q_params, log_alpha, policy_opt_state, q_opt_state,
                              alpha_opt_state, key, state.steps + 1)
    metrics = {"critic_loss": q_loss, "actor_loss": pi_loss, "temperature_loss": alpha_loss,
               "alpha": jnp.exp(log_alpha), "q_mean": q_mean, "entropy": -jnp.mean(log_prob)}
    return new_state, metrics

  return LearnerFns(init=init, update=update, params=lambda state: state.policy_params)
