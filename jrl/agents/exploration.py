"""Epsilon-greedy acting on Q-values, shared by the value-based agents with feed-forward
Q-networks (DQN, PQN): epsilon decayed linearly over the actor's env steps, greedy (or
`eval_epsilon`) for evaluation.

Both read from the agent's config: epsilon_init, epsilon_final, epsilon_decay_steps (env steps
of one actor) and eval_epsilon."""

from typing import Any, Callable

import distrax
import jax
import jax.numpy as jnp
import optax

from jrl.types import ActorState, Array, Params, PolicyFns, initial_actor_state


def epsilon_schedule(cfg: Any) -> optax.Schedule:
  """epsilon_init -> epsilon_final linearly over epsilon_decay_steps env steps of one actor."""
  return optax.linear_schedule(cfg.epsilon_init, cfg.epsilon_final, cfg.epsilon_decay_steps)


def epsilon_greedy_policy(q_apply: Callable[[Params, Array], Array], cfg: Any, evaluation: bool = False) -> PolicyFns:
  """Epsilon-greedy on `q_apply(params, obs [B, *obs_shape]) -> q [B, A]`; no extras.

  Acting: epsilon from `epsilon_schedule(cfg)` at the actor's env steps; evaluation: `eval_epsilon`
  (0: the argmax). Each call splits the actor's key once and adds B to its env steps.
  """
  schedule = epsilon_schedule(cfg)

  def select_action(params, obs: Array, is_first: Array, state: ActorState):
    del is_first  # feed-forward: nothing to reset at episode starts
    key, sample_key = jax.random.split(state.key)
    q = q_apply(params, obs)
    if evaluation and cfg.eval_epsilon == 0.0:
      action = jnp.argmax(q, axis=-1)
    else:
      epsilon = cfg.eval_epsilon if evaluation else schedule(state.env_steps)
      action = distrax.EpsilonGreedy(q, epsilon).sample(seed=sample_key)
    return action.astype(jnp.int32), {}, ActorState(key, state.env_steps + obs.shape[0])

  return PolicyFns(init=initial_actor_state, select_action=select_action)
