"""SAC policies: a sample of the tanh-Gaussian for acting, its mode (tanh of the mean) for evaluation."""

import jax
import jax.numpy as jnp

from jrl.agents.sac.config import Config
from jrl.agents.sac.networks import Networks, tanh_gaussian
from jrl.types import ActorState, Array, PolicyFns, initial_actor_state


def make_policy(networks: Networks, cfg: Config, evaluation: bool = False) -> PolicyFns:
  del cfg

  def select_action(params, obs: Array, is_first: Array, state: ActorState):
    del is_first  # feed-forward: nothing to reset at episode starts
    key, sample_key = jax.random.split(state.key)
    mean, log_std = networks.policy_apply(params, obs)
    action = jnp.tanh(mean) if evaluation else tanh_gaussian(mean, log_std).sample(seed=sample_key)
    return networks.to_env(action).astype(jnp.float32), {}, ActorState(key, state.env_steps + obs.shape[0])

  return PolicyFns(init=initial_actor_state, select_action=select_action)
