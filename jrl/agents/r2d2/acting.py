"""R2D2 policies: epsilon-greedy over the recurrent Q-network, carrying the core state of each env.

The state resets to zeros where `is_first` marks an episode start; the state each step
started from is reported in the extras (START_STATE_KEY) for the sequence adder.
"""

from typing import NamedTuple

import distrax
import jax
import jax.numpy as jnp
import optax

from jrl.agents.r2d2.config import Config
from jrl.agents.r2d2.networks import Networks
from jrl.replay.sequence_adder import START_STATE_KEY
from jrl.types import Array, PolicyFns, PRNGKey


class RecurrentActorState(NamedTuple):
  key: PRNGKey      # randomness of action sampling
  env_steps: Array  # [] int32 env steps taken (drives the exploration schedule)
  core: Array       # [B, S] core state after each env's last step


def epsilon_schedule(cfg: Config) -> optax.Schedule:
  return optax.linear_schedule(cfg.epsilon_init, cfg.epsilon_final, cfg.epsilon_decay_steps)


def make_policy(networks: Networks, cfg: Config, evaluation: bool = False) -> PolicyFns:
  schedule = epsilon_schedule(cfg)

  def init(key: PRNGKey, num_envs: int) -> RecurrentActorState:
    return RecurrentActorState(key, jnp.zeros((), jnp.int32), networks.initial_state(num_envs))

  def select_action(params, obs: Array, is_first: Array, state: RecurrentActorState):
    key, sample_key = jax.random.split(state.key)
    core = jnp.where(jnp.asarray(is_first)[:, None], networks.initial_state(obs.shape[0]), state.core)
    q, next_core = networks.apply(params, obs, core)
    if evaluation and cfg.eval_epsilon == 0.0:
      action = jnp.argmax(q, axis=-1)
    else:
      epsilon = cfg.eval_epsilon if evaluation else schedule(state.env_steps)
      action = distrax.EpsilonGreedy(q, epsilon).sample(seed=sample_key)
    new_state = RecurrentActorState(key, state.env_steps + obs.shape[0], next_core)
    return action.astype(jnp.int32), {START_STATE_KEY: core}, new_state

  return PolicyFns(init=init, select_action=select_action)
