"""The agent's pieces for an experiment, shared by the embedded runner and distributed nodes."""

import dataclasses
import functools
from typing import Any, Dict, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from jrl import accelerators, cpu_jit, envs, pixel_envs, seeding
from jrl.agents import get_agent
from jrl.networks import example_observation
from jrl.replay.spec import ReplaySpec
from jrl.specs import EnvSpec
from jrl.types import Transition


class AgentParts(NamedTuple):
  agent: Any            # the agent module (Config, make_networks, make_learner, make_policy, make_replay_spec)
  env_spec: EnvSpec
  networks: Any
  replay_spec: ReplaySpec


def env_spec_of(env_id: str) -> EnvSpec:
  """The env's spaces as jrl describes them, from one env made and closed (no JAX arrays)."""
  if env_id.startswith("gymnax:"):  # a device-backend run (e.g. reloading its policy)
    from jrl.gymnax_envs import env_spec as gymnax_env_spec
    return gymnax_env_spec(env_id)
  probe = envs.make_vector_env(env_id, 1, seed=0)
  spec = envs.env_spec(probe)
  probe.close()
  return spec


def build_agent_parts(agent_name: str, env_id: str, agent_cfg, env_spec: Optional[EnvSpec] = None) -> AgentParts:
  """Checks agent and env (ConfigError on a mismatch) and builds networks and replay spec
  (`env_spec`: the env's, if already made with `env_spec_of`)."""
  agent = get_agent(agent_name)
  if env_spec is None:
    env_spec = env_spec_of(env_id)
  networks = agent.make_networks(env_spec, agent_cfg)
  replay_spec = agent.make_replay_spec(agent_cfg)
  stack = pixel_envs.frame_stack(env_id)
  if stack and env_spec.observation_shape[-1:] == (stack,):  # stacked frames: replay stores each once
    replay_spec = dataclasses.replace(replay_spec, frame_stack=stack)
  return AgentParts(agent, env_spec, networks, replay_spec)


def build_acting_parts(agent_name: str, env_id: str, agent_cfg, actor_device: str = "auto") -> Tuple[AgentParts, bool]:
  """`build_agent_parts` for a process that acts, whose CPU dispatch is first chosen from the
  env's observations (`cpu_jit.choose_dispatch`: before the networks make JAX's CPU client);
  returns the parts and whether jitted calls now return before their results are computed.
  `actor_device` (--actor_device) is checked against the devices JAX sees here, before a run writes
  anything: 'accelerator' where there is none is a ConfigError."""
  env_spec = env_spec_of(env_id)
  asynchronous = cpu_jit.choose_dispatch(env_spec.observation_shape)
  parts = build_agent_parts(agent_name, env_id, agent_cfg, env_spec)
  accelerators.actor_device(actor_device, jax.default_backend())
  return parts, asynchronous


def success_threshold(exp) -> Optional[float]:
  """The return that counts as solved: the experiment's own, else the env's gymnasium threshold."""
  return exp.reward_threshold if exp.reward_threshold is not None else envs.reward_threshold(exp.env)


def example_transition(spec: EnvSpec) -> Transition:
  obs = np.zeros(spec.observation_shape, spec.observation_dtype)
  return Transition(obs, np.zeros(spec.action_shape, spec.action_dtype), np.float32(0), np.float32(0), obs)


def policy_extras_example(parts: AgentParts, agent_cfg) -> Dict[str, np.ndarray]:
  """Zeros shaped like one env step's policy extras, from abstract evaluation (no compute)
  of the learner's init (for the policy's parameters) and the policy."""
  learner = parts.agent.make_learner(parts.networks, agent_cfg)
  policy = parts.agent.make_policy(parts.networks, agent_cfg)
  params = jax.eval_shape(lambda key: learner.params(learner.init(key)), jax.random.PRNGKey(0))
  obs = example_observation(parts.env_spec)
  is_first = jnp.ones((1,), bool)
  _, extras, _ = jax.eval_shape(policy.select_action, params, obs, is_first, policy.init(jax.random.PRNGKey(0), 1))
  return {k: np.zeros(v.shape[1:], v.dtype) for k, v in extras.items()}


def example_item(parts: AgentParts, agent_cfg) -> Any:
  """Zeros shaped like one replay item, as the agent's item kind stores it (a block of
  transitions, or a sequence with the policy's extras)."""
  spec = parts.replay_spec
  extras = functools.partial(policy_extras_example, parts, agent_cfg)  # computed only where the kind keeps them
  return spec.kind.example_item(spec, example_transition(parts.env_spec), extras)


def make_actor(exp, parts: AgentParts, agent_cfg, policy: Any, seed: int, sink, timer, dispatch_ahead: bool):
  """One process's actor (an embedded run's, or an actor node's): `exp.num_envs` envs, env i
  seeded with `seed + i`, and the adder the agent needs. `policy` is a `BatchedPolicy`, or
  `(variables, key, timer)` for the agent's own policy in this process. The adders are the
  agent's item kind's (`ItemKind.make_adder`: n-step folding, reward clipping). With
  `exp.env_groups` > 1 the envs step as that many groups in turn (`GroupedActor`), which
  takes the policy in this process. That policy acts on the device `exp.actor_device` picks for a
  call on its batch (`policy_device`: an actor node's JAX sees only the CPU); the actor's
  `policy_device` names it for the run's summary (None: a `BatchedPolicy`, which acts elsewhere)."""
  from jrl.actors.actor import (Actor, GroupedActor, GroupedPolicy, LocalPolicy,  # the actor shells import jax
                                policy_device)
  groups = exp.env_groups
  device = None
  if isinstance(policy, tuple):
    variables, key, policy_timer = policy
    policy_fns = parts.agent.make_policy(parts.networks, agent_cfg)
    spec = parts.env_spec
    device = policy_device(exp.actor_device, policy_fns, variables.params, spec.observation_shape,
                           spec.observation_dtype, exp.num_envs // groups, key)
    if groups > 1:
      policy = GroupedPolicy(policy_fns, variables, key, exp.num_envs, groups, timer=policy_timer, device=device)
    else:
      policy = LocalPolicy(policy_fns, variables, key, num_envs=exp.num_envs, timer=policy_timer, device=device)
  if groups == 1:
    actor = Actor(envs.make_vector_env(exp.env, exp.num_envs, seed), policy,
                  adder=parts.replay_spec.make_adder(exp.num_envs), sink=sink, timer=timer,
                  dispatch_ahead=dispatch_ahead)
  else:
    size = exp.num_envs // groups
    actor = GroupedActor([envs.make_vector_env(exp.env, size, seed + g * size) for g in range(groups)], policy,
                         [parts.replay_spec.make_adder(size) for _ in range(groups)], sink=sink,
                         timer=timer, dispatch_ahead=dispatch_ahead)
  actor.policy_device = device
  return actor


def replay_batches(replay, parts: AgentParts, agent_cfg, exp, batch_size: int, mesh: jax.sharding.Mesh,
                   stop=None, timer=None):
  """The learner's batches of this experiment from a served replay (`replay`, a
  `jrl.replay.service.ReplayClient`: a Reverb server's or jrl's own), prepared `exp.prefetch` calls
  ahead and placed sharded on `mesh`: an embedded Reverb run's and a distributed learner's."""
  from jrl.learners import sharding

  spec = parts.replay_spec
  return replay.batches(spec, example_item(parts, agent_cfg), spec.kind.updates_per_call(exp.updates_per_call),
                        batch_size, seeding.env_seed(exp.seed, "replay", exp.process_id) + 1,
                        lambda batch: sharding.put_batch(batch, mesh), exp.prefetch, stop=stop, timer=timer)
