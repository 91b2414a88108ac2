"""TD3 policies: the deterministic action plus Gaussian exploration noise (uniform at random for
the first `uniform_steps`) for acting, the deterministic action for evaluation."""

import jax
import jax.numpy as jnp

from jrl.agents.td3.config import Config
from jrl.agents.td3.networks import Networks
from jrl.types import ActorState, Array, PolicyFns, initial_actor_state


def make_policy(networks: Networks, cfg: Config, evaluation: bool = False) -> PolicyFns:

  def select_action(params, obs: Array, is_first: Array, state: ActorState):
    del is_first  # feed-forward: nothing to reset at episode starts
    key, noise_key, uniform_key = jax.random.split(state.key, 3)
    action = networks.policy_apply(params, obs)
    if not evaluation:
      noise = cfg.exploration_noise * jax.random.normal(noise_key, action.shape)
      uniform = jax.random.uniform(uniform_key, action.shape, minval=-1.0, maxval=1.0)
      action = jnp.where(state.env_steps < cfg.uniform_steps, uniform, jnp.clip(action + noise, -1.0, 1.0))
    return networks.to_env(action).astype(jnp.float32), {}, ActorState(key, state.env_steps + obs.shape[0])

  return PolicyFns(init=initial_actor_state, select_action=select_action)
