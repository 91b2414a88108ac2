"""PPO policies: sample the categorical (log-prob in extras) for acting; for evaluation its mode, or a
sample where cfg.greedy_eval is false."""

from jrl.agents.actor_critic import Networks, make_categorical_policy
from jrl.agents.ppo.config import Config
from jrl.types import PolicyFns


def make_policy(networks: Networks, cfg: Config, evaluation: bool = False) -> PolicyFns:
  return make_categorical_policy(networks, evaluation and cfg.greedy_eval, report="log_prob")
