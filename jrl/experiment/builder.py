"""The agent's pieces for an experiment, shared by the embedded runner and distributed nodes."""

from typing import Any, NamedTuple

import numpy as np

from jrl import envs
from jrl.agents import get_agent
from jrl.replay.spec import ReplaySpec
from jrl.specs import EnvSpec
from jrl.types import Transition


class AgentParts(NamedTuple):
  agent: Any            # the agent module (Config, make_networks, make_learner, make_policy, make_replay_spec)
  env_spec: EnvSpec
  networks: Any
  replay_spec: ReplaySpec


def build_agent_parts(agent_name: str, env_id: str, agent_cfg) -> AgentParts:
  """Checks agent and env (ConfigError on a mismatch) and builds networks and replay spec."""
  agent = get_agent(agent_name)
  probe = envs.make_vector_env(env_id, 1, seed=0)
  env_spec = envs.env_spec(probe)
  probe.close()
  networks = agent.make_networks(env_spec, agent_cfg)
  return AgentParts(agent, env_spec, networks, agent.make_replay_spec(agent_cfg))


def example_transition(spec: EnvSpec) -> Transition:
  obs = np.zeros(spec.observation_shape, spec.observation_dtype)
  return Transition(obs, np.zeros(spec.action_shape, spec.action_dtype), np.float32(0), np.float32(0), obs)
