"""PPO policies: sample the categorical (log-prob in extras) for acting, its mode for evaluation."""

from jrl.agents.actor_critic import Networks, make_categorical_policy
from jrl.agents.ppo.config import Config
from jrl.types import PolicyFns


def make_policy(networks: Networks, cfg: Config, evaluation: bool = False) -> PolicyFns:
  del cfg
  return make_categorical_policy(networks, evaluation, report="log_prob")
