"""The actor-critic network and categorical policy shared by PPO and IMPALA."""

from typing import Any, Callable, NamedTuple, Optional, Sequence

import distrax
import flax.linen as nn
import jax
import jax.numpy as jnp

from jrl.agents.modules import init_apply
from jrl.errors import ConfigError
from jrl.networks import MLP
from jrl.specs import EnvSpec
from jrl.types import ActorState, Array, Params, PolicyFns, PRNGKey, initial_actor_state


class ActorCritic(nn.Module):
  """Separate MLP torsos for the policy logits and the value."""
  num_actions: int
  hidden_sizes: Sequence[int]

  @nn.compact
  def __call__(self, obs):
    logits = nn.Dense(self.num_actions)(MLP(self.hidden_sizes)(obs))
    value = nn.Dense(1)(MLP(self.hidden_sizes)(obs))[..., 0]
    return logits, value


class Networks(NamedTuple):
  init: Callable[[PRNGKey], Params]
  apply: Callable[[Params, Array], tuple]  # obs [B, *obs_shape] -> (logits [B, A], value [B])


def make_networks(agent: str, spec: EnvSpec, hidden_sizes: Sequence[int], module: Optional[Any] = None) -> Networks:
  """`module`: any flax module mapping obs [B, *obs_shape] to (logits [B, A], value [B]), or an
  (init, apply) pair; None: `ActorCritic` with MLP torsos of `hidden_sizes`."""
  if not spec.discrete:
    raise ConfigError("agent", f"{agent} supports Discrete action spaces only (no continuous head yet); "
                               f"the env has a Box of shape {spec.action_shape}")
  if module is None:
    module = ActorCritic(spec.num_actions, tuple(hidden_sizes))
  dummy = jnp.zeros((1,) + spec.observation_shape, jnp.float32)
  return Networks(*init_apply(module, dummy))


def make_categorical_policy(networks: Networks, evaluation: bool, report: str) -> PolicyFns:
  """Samples the categorical over the logits (its mode when evaluating) and reports
  `report` in extras: "log_prob" of the action (PPO) or the "logits" (IMPALA)."""

  def select_action(params, obs: Array, is_first: Array, state: ActorState):
    del is_first  # feed-forward: nothing to reset at episode starts
    key, sample_key = jax.random.split(state.key)
    logits, _ = networks.apply(params, obs)
    dist = distrax.Categorical(logits=logits)
    action = dist.mode() if evaluation else dist.sample(seed=sample_key)
    extras = {"log_prob": dist.log_prob(action)} if report == "log_prob" else {"logits": logits}
    return action.astype(jnp.int32), extras, ActorState(key, state.env_steps + obs.shape[0])

  return PolicyFns(init=initial_actor_state, select_action=select_action)
