"""DQN networks: a Q-network over a Discrete action space."""

from typing import Any, Callable, NamedTuple, Optional

from jrl.agents.dqn.config import Config
from jrl.agents.modules import init_apply
from jrl.errors import ConfigError
from jrl.networks import QNetwork, example_observation, make_torso
from jrl.specs import EnvSpec
from jrl.types import Array, Params, PRNGKey


class Networks(NamedTuple):
  init: Callable[[PRNGKey], Params]
  apply: Callable[[Params, Array], Array]  # obs [B, *obs_shape] -> q [B, num_actions]


def make_networks(spec: EnvSpec, cfg: Config, module: Optional[Any] = None) -> Networks:
  """The Q-network: `module` is any flax module mapping obs [B, *obs_shape] to q
  [B, num_actions], or an (init, apply) pair; None: a `QNetwork` on `cfg.torso` (an MLP of
  `cfg.hidden_sizes` for vectors, a CNN for frames; dueling with `cfg.dueling`)."""
  if not spec.discrete:
    raise ConfigError("agent", f"dqn needs a Discrete action space, the env has a continuous one "
                               f"(Box of shape {spec.action_shape})")
  if module is None:
    torso = make_torso(cfg.torso, spec.observation_shape, cfg.hidden_sizes)
    module = QNetwork(num_actions=spec.num_actions, hidden_sizes=tuple(cfg.hidden_sizes), dueling=cfg.dueling,
                      torso=torso)
  dummy = example_observation(spec)
  return Networks(*init_apply(module, dummy))
