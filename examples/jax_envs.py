"""A JAX-native env of your own for `--backend device`: `--env gymnax:examples.jax_envs:corridor`.

Any function returning a gymnax `Environment` (or a pair `(env, env_params)`) plugs in where a
gymnax id does; the whole env then runs inside the device backend's compiled loop.

    python -m launch.train --backend device --agent dqn --env gymnax:examples.jax_envs:corridor --steps 20000
"""

from typing import Any, Dict, Tuple

import jax
import jax.numpy as jnp
from flax import struct
from gymnax.environments import environment, spaces


@struct.dataclass
class CorridorState(environment.EnvState):
  position: jax.Array  # int32 cell, 0 .. 2 x half_length
  goal: jax.Array      # int32: 0 the left end, 1 the right end


@struct.dataclass
class CorridorParams(environment.EnvParams):
  half_length: int = 5
  step_cost: float = 0.01
  max_steps_in_episode: int = 50


class Corridor(environment.Environment):
  """A corridor of 2 x half_length + 1 cells: start in the middle, move left (0) or right (1)
  towards the goal, one end drawn at each reset and shown in the observation; reaching it pays 1
  and ends the episode, every other step costs `step_cost`, the other end pays nothing more.
  The best return is 1 - (half_length - 1) x step_cost (0.96 for the defaults); always moving one
  way gets 0.96 or -0.5, 0.23 on average. Observations: [position in [-1, 1], goal side -1 / +1]."""

  reward_threshold = 0.8  # the run's success threshold (`--stop_at_threshold`, steps to threshold)

  @property
  def default_params(self) -> CorridorParams:
    return CorridorParams()

  def step_env(self, key: jax.Array, state: CorridorState, action: jax.Array,
               params: CorridorParams) -> Tuple[jax.Array, CorridorState, jax.Array, jax.Array, Dict[str, Any]]:
    position = jnp.clip(state.position + jnp.where(action == 1, 1, -1), 0, 2 * params.half_length)
    at_goal = position == state.goal * 2 * params.half_length
    reward = jnp.where(at_goal, 1.0, -params.step_cost)
    state = CorridorState(time=state.time + 1, position=position, goal=state.goal)
    return self._observe(state, params), state, reward, at_goal, {}

  def reset_env(self, key: jax.Array, params: CorridorParams) -> Tuple[jax.Array, CorridorState]:
    goal = jax.random.bernoulli(key).astype(jnp.int32)
    state = CorridorState(time=0, position=jnp.asarray(params.half_length, jnp.int32), goal=goal)
    return self._observe(state, params), state

  def _observe(self, state: CorridorState, params: CorridorParams) -> jax.Array:
    position = state.position / params.half_length - 1.0
    return jnp.stack([position, 2.0 * state.goal - 1.0]).astype(jnp.float32)

  def action_space(self, params: CorridorParams = None) -> spaces.Discrete:
    return spaces.Discrete(2)

  def observation_space(self, params: CorridorParams) -> spaces.Box:
    return spaces.Box(-1.0, 1.0, (2,), jnp.float32)


def corridor() -> Corridor:
  return Corridor()


def not_an_env():
  """For the error path: a factory that returns something else."""
  return "CartPole-v1"
