"""TD3 learner: pure init and update (Fujimoto et al., 2018, "Addressing Function Approximation
Error in Actor-Critic Methods"): clipped double-Q targets from a smoothed target policy, and the
actor and the targets updated once every `policy_delay` critic updates."""

from typing import Callable, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp
import optax

from jrl.agents.td3.config import Config
from jrl.agents.td3.networks import Networks
from jrl.types import Array, LearnerBatch, LearnerFns, Params, PRNGKey, Transition


class TrainingState(NamedTuple):
  policy_params: Params
  target_policy_params: Params
  q_params: Params
  target_q_params: Params
  policy_opt_state: optax.OptState
  q_opt_state: optax.OptState
  key: PRNGKey   # the target smoothing noise
  steps: Array   # [] int32 critic updates done


def smoothed_target_action(networks: Networks, target_policy_params: Params, next_observation: Array,
                           noise: Array, cfg: Config) -> Array:
  """The target policy's action [B, A] plus `cfg.target_noise` x `noise` (standard normal [B, A])
  clipped to +-`cfg.target_noise_clip`, the sum clipped to the box [-1, 1]."""
  smoothing = jnp.clip(cfg.target_noise * noise, -cfg.target_noise_clip, cfg.target_noise_clip)
  return jnp.clip(networks.policy_apply(target_policy_params, next_observation) + smoothing, -1.0, 1.0)


def critic_targets(networks: Networks, state: TrainingState, transitions: Transition, noise: Array,
                   cfg: Config) -> Array:
  """Clipped double-Q targets [B]: reward + discount x min of the twin target critics at the
  smoothed target action. `reward` is the n-step sum and `discount` gamma^n (0 after a
  termination): the n-step transition's own (`jrl.types.Transition`)."""
  t = transitions
  next_action = smoothed_target_action(networks, state.target_policy_params, t.next_observation, noise, cfg)
  next_q = networks.q_apply(state.target_q_params, t.next_observation, next_action).min(axis=0)
  return jax.lax.stop_gradient(t.reward + t.discount * next_q)


def critic_loss(networks: Networks, q_params: Params, state: TrainingState, batch: LearnerBatch, noise: Array,
                cfg: Config) -> Tuple[Array, Array]:
  """The default critic loss: importance-weighted squared errors of both critics against the
  clipped double-Q targets, / 2. batch: transitions [B, ...] (actions in the env's bounds),
  weights [B]. Returns (loss [], mean q [])."""
  target = critic_targets(networks, state, batch.transitions, noise, cfg)
  t = batch.transitions
  q = networks.q_apply(q_params, t.observation, networks.from_env(t.action))
  return 0.5 * jnp.mean(batch.weights * ((q - target[None]) ** 2).sum(axis=0)), q.mean()


def actor_loss(networks: Networks, policy_params: Params, q_params: Params, obs: Array, cfg: Config) -> Array:
  """The default actor loss: -mean Q_1(s, pi(s)) over obs [B, ...] (the first critic, as in the paper)."""
  del cfg
  return -jnp.mean(networks.q_apply(q_params, obs, networks.policy_apply(policy_params, obs))[0])


class Losses(NamedTuple):
  """TD3's two losses; replace either, e.g. `td3.Losses(critic=my_critic_loss)`."""
  critic: Callable[..., Tuple[Array, Array]] = critic_loss
  actor: Callable[..., Array] = actor_loss


def make_learner(networks: Networks, cfg: Config, loss: Optional[Losses] = None,
                 optimizer: Optional[optax.GradientTransformation] = None) -> LearnerFns:
  """Pure init and update; `loss` (a `Losses`) replaces the default losses, `optimizer` (one optax
  transformation, each part its own state) the two Adams of the actor and the critics.

  update(state, batch): batch transitions [B, ...], weights [B] -> (state, metrics). Every call
  updates the critics; every `policy_delay`-th also the actor and, by Polyak averaging with
  `tau`, the target actor and critics.
  """
  losses = Losses() if loss is None else loss
  policy_opt = optax.adam(cfg.actor_learning_rate) if optimizer is None else optimizer
  q_opt = optax.adam(cfg.critic_learning_rate) if optimizer is None else optimizer

  def init(key) -> TrainingState:
    policy_key, q_key, key = jax.random.split(key, 3)
    policy_params = networks.policy_init(policy_key)
    q_params = networks.q_init(q_key)
    return TrainingState(policy_params, policy_params, q_params, q_params, policy_opt.init(policy_params),
                         q_opt.init(q_params), key, jnp.zeros((), jnp.int32))

  def critic_objective(q_params, state: TrainingState, batch: LearnerBatch, noise):
    return losses.critic(networks, q_params, state, batch, noise, cfg)

  def actor_objective(policy_params, q_params, obs):
    return losses.actor(networks, policy_params, q_params, obs, cfg)

  def update_actor_and_targets(state: TrainingState, q_params, obs):
    pi_loss, pi_grads = jax.value_and_grad(actor_objective)(state.policy_params, q_params, obs)
    pi_updates, policy_opt_state = policy_opt.update(pi_grads, state.policy_opt_state, state.policy_params)
    policy_params = optax.apply_updates(state.policy_params, pi_updates)
    target_policy_params = optax.incremental_update(policy_params, state.target_policy_params, cfg.tau)
    target_q_params = optax.incremental_update(q_params, state.target_q_params, cfg.tau)
    return policy_params, target_policy_params, target_q_params, policy_opt_state, pi_loss

  def keep_actor_and_targets(state: TrainingState, q_params, obs):
    del q_params, obs
    return (state.policy_params, state.target_policy_params, state.target_q_params, state.policy_opt_state,
            jnp.zeros((), jnp.float32))

  def update(state: TrainingState, batch: LearnerBatch):
    key, noise_key = jax.random.split(state.key)
    noise = jax.random.normal(noise_key, batch.transitions.action.shape, jnp.float32)
    (q_loss, q_mean), q_grads = jax.value_and_grad(critic_objective, has_aux=True)(state.q_params, state, batch,
                                                                                    noise)
    q_updates, q_opt_state = q_opt.update(q_grads, state.q_opt_state, state.q_params)
    q_params = optax.apply_updates(state.q_params, q_updates)
    steps = state.steps + 1
    delayed = jax.lax.cond(steps % cfg.policy_delay == 0, update_actor_and_targets, keep_actor_and_targets,
                           state, q_params, batch.transitions.observation)
    policy_params, target_policy_params, target_q_params, policy_opt_state, pi_loss = delayed
    new_state = TrainingState(policy_params, target_policy_params, q_params, target_q_params, policy_opt_state,
                              q_opt_state, key, steps)
    # Metrics are averaged over updates, and the actor learns on one in `policy_delay`: its loss
    # counts `policy_delay` times there and 0 elsewhere, so the average is the actor's loss.
    metrics = {"critic_loss": q_loss, "actor_loss": pi_loss * cfg.policy_delay, "q_mean": q_mean, "grad_norm": optax.tree.norm(q_grads)}
    return new_state, metrics

  return LearnerFns(init=init, update=update, params=lambda state: state.policy_params)
