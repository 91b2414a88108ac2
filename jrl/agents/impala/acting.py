"""IMPALA policies: sample the categorical and report its logits (the behaviour policy) in extras; for
evaluation its mode, or a sample where cfg.greedy_eval is false."""

from jrl.agents.actor_critic import Networks, make_categorical_policy
from jrl.agents.impala.config import Config
from jrl.types import PolicyFns


def make_policy(networks: Networks, cfg: Config, evaluation: bool = False) -> PolicyFns:
  return make_categorical_policy(networks, evaluation and cfg.greedy_eval, report="logits")
