"""DQN policies: epsilon-greedy for acting, greedy for evaluation (see `jrl.agents.exploration`)."""

from jrl.agents import exploration
from jrl.agents.dqn.config import Config
from jrl.agents.dqn.networks import Networks
from jrl.types import PolicyFns


def make_policy(networks: Networks, cfg: Config, evaluation: bool = False) -> PolicyFns:
  """Epsilon-greedy on the Q-values; no extras."""
  return exploration.epsilon_greedy_policy(networks.apply, cfg, evaluation)
