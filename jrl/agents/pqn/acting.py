"""PQN policies: epsilon-greedy for acting (epsilon decayed linearly over the actor's env
steps), greedy for evaluation."""

import distrax
import jax
import jax.numpy as jnp
import optax

from jrl.agents.pqn.config import Config
from jrl.agents.pqn.networks import Networks
from jrl.types import ActorState, Array, PolicyFns, initial_actor_state


def epsilon_schedule(cfg: Config) -> optax.Schedule:
  """epsilon_init -> epsilon_final linearly over epsilon_decay_steps env steps of one actor."""
  return optax.linear_schedule(cfg.epsilon_init, cfg.epsilon_final, cfg.epsilon_decay_steps)


def make_policy(networks: Networks, cfg: Config, evaluation: bool = False) -> PolicyFns:
  """Epsilon-greedy on the Q-values; no extras (the learner recomputes what it needs)."""
  schedule = epsilon_schedule(cfg)

  def select_action(params, obs: Array, is_first: Array, state: ActorState):
    del is_first  # feed-forward: nothing to reset at episode starts
    key, sample_key = jax.random.split(state.key)
    q = networks.apply(params, obs)
    if evaluation and cfg.eval_epsilon == 0.0:
      action = jnp.argmax(q, axis=-1)
    else:
      epsilon = cfg.eval_epsilon if evaluation else schedule(state.env_steps)
      action = distrax.EpsilonGreedy(q, epsilon).sample(seed=sample_key)
    return action.astype(jnp.int32), {}, ActorState(key, state.env_steps + obs.shape[0])

  return PolicyFns(init=initial_actor_state, select_action=select_action)
