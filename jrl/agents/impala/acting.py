"""IMPALA policies: sample the categorical and report its logits (the behaviour policy) in extras."""

from typing import NamedTuple

import distrax
import jax
import jax.numpy as jnp

from jrl.agents.impala.config import Config
from jrl.agents.ppo.networks import Networks
from jrl.types import Array, PolicyFns, PRNGKey


class ActorState(NamedTuple):
  key: PRNGKey
  env_steps: Array  # [] int32


def make_policy(networks: Networks, cfg: Config, evaluation: bool = False) -> PolicyFns:
  del cfg

  def init(key: PRNGKey) -> ActorState:
    return ActorState(key, jnp.zeros((), jnp.int32))

  def select_action(params, obs: Array, state: ActorState):
    key, sample_key = jax.random.split(state.key)
    logits, _ = networks.apply(params, obs)
    dist = distrax.Categorical(logits=logits)
    action = dist.mode() if evaluation else dist.sample(seed=sample_key)
    return action.astype(jnp.int32), {"logits": logits}, ActorState(key, state.env_steps + obs.shape[0])

  return PolicyFns(init=init, select_action=select_action)
