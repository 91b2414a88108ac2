"""The actor-critic network and its policy, shared by PPO and IMPALA: a categorical head for
Discrete action spaces, a diagonal Gaussian (distrax) for Box ones."""

from typing import Any, Callable, NamedTuple, Optional, Sequence

import distrax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jrl.agents.modules import init_apply
from jrl.networks import MLP, example_observation, make_torso
from jrl.specs import EnvSpec
from jrl.types import ActorState, Array, Params, PolicyFns, PRNGKey, initial_actor_state


class ActorCritic(nn.Module):
  """Separate MLP torsos for the policy and the value, or one shared `torso` (a CNN for frames).

  Discrete (`continuous=False`): the policy output is logits [B, num_actions]. Box: it is
  [B, 2 D] (the Gaussian's mean, then its log standard deviation, a learned parameter per
  action dimension, independent of the observation), D = `num_actions`.
  """
  num_actions: int
  hidden_sizes: Sequence[int]
  torso: Optional[nn.Module] = None
  continuous: bool = False

  @nn.compact
  def __call__(self, obs):
    if self.torso is None:
      policy_h, value_h = MLP(self.hidden_sizes)(obs), MLP(self.hidden_sizes)(obs)
    else:
      policy_h = value_h = self.torso(obs)
    policy = nn.Dense(self.num_actions)(policy_h)
    if self.continuous:
      log_std = self.param("log_std", nn.initializers.zeros, (self.num_actions,))
      policy = jnp.concatenate([policy, jnp.broadcast_to(log_std, policy.shape)], axis=-1)
    value = nn.Dense(1)(value_h)[..., 0]
    return policy, value


def categorical(logits: Array) -> distrax.Distribution:
  return distrax.Categorical(logits=logits)


def gaussian(policy: Array) -> distrax.Distribution:
  """The diagonal Gaussian of a policy output [..., 2 D] (mean, log std)."""
  mean, log_std = jnp.split(policy, 2, axis=-1)
  return distrax.MultivariateNormalDiag(mean, jnp.exp(log_std))


class Networks(NamedTuple):
  init: Callable[[PRNGKey], Params]
  apply: Callable[[Params, Array], tuple]  # obs [B, *obs_shape] -> (policy output [B, P], value [B])
  distribution: Callable[[Array], Any] = categorical  # policy output -> distrax distribution over actions


def make_networks(agent: str, spec: EnvSpec, hidden_sizes: Sequence[int], module: Optional[Any] = None,
                  torso: str = "auto") -> Networks:
  """`module`: any flax module mapping obs [B, *obs_shape] to (policy output [B, P], value [B]), or
  an (init, apply) pair; None: `ActorCritic` on `torso` (MLPs of `hidden_sizes` for vectors, a
  shared CNN for frames). Discrete actions: the output is logits [B, A]; Box actions: a
  Gaussian's mean and log std [B, 2 D] (see `gaussian`)."""
  del agent
  continuous = not spec.discrete
  if module is None:
    size = spec.num_actions if spec.discrete else int(np.prod(spec.action_shape))
    module = ActorCritic(size, tuple(hidden_sizes), make_torso(torso, spec.observation_shape, hidden_sizes),
                         continuous)
  init, apply = init_apply(module, example_observation(spec))
  return Networks(init, apply, gaussian if continuous else categorical)


def make_categorical_policy(networks: Networks, evaluation: bool, report: str) -> PolicyFns:
  """Samples the policy's distribution (categorical or Gaussian; its mode when evaluating) and
  reports `report` in extras: "log_prob" of the action (PPO) or the policy output, "logits"
  (IMPALA). Gaussian actions are not clipped here: the actor and evaluator clip what they send
  to the env to its bounds (`jrl.specs.env_action`; MuJoCo's control cost counts the unclipped
  action), and replay keeps the sampled action, whose log-prob the learner needs."""

  def select_action(params, obs: Array, is_first: Array, state: ActorState):
    del is_first  # feed-forward: nothing to reset at episode starts
    key, sample_key = jax.random.split(state.key)
    logits, _ = networks.apply(params, obs)
    dist = networks.distribution(logits)
    action = dist.mode() if evaluation else dist.sample(seed=sample_key)
    extras = {"log_prob": dist.log_prob(action)} if report == "log_prob" else {"logits": logits}
    action = action.astype(jnp.int32) if networks.distribution is categorical else action.astype(jnp.float32)
    return action, extras, ActorState(key, state.env_steps + obs.shape[0])

  return PolicyFns(init=initial_actor_state, select_action=select_action)
