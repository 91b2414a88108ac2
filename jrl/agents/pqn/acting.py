"""PQN policies: epsilon-greedy for acting (epsilon decayed linearly over the actor's env
steps), greedy for evaluation (see `jrl.agents.exploration`)."""

from jrl.agents import exploration
from jrl.agents.pqn.config import Config
from jrl.agents.pqn.networks import Networks
from jrl.types import PolicyFns

epsilon_schedule = exploration.epsilon_schedule  # epsilon_init -> epsilon_final over epsilon_decay_steps of one actor


def make_policy(networks: Networks, cfg: Config, evaluation: bool = False) -> PolicyFns:
  """Epsilon-greedy on the Q-values; no extras (the learner recomputes what it needs)."""
  return exploration.epsilon_greedy_policy(networks.apply, cfg, evaluation)
