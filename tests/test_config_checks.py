"""Every agent's config, the experiment config and the replay spec refuse bad values with a
ConfigError that names the field, before any work starts."""

import pytest

from jrl.agents import AGENTS, get_agent
from jrl.errors import ConfigError
from jrl.experiment.config import ExperimentConfig
from jrl.replay.spec import ReplaySpec

# (field, bad value, message) for every agent config that has the field.
AGENT_CASES = [
    ("batch_size", 0, "batch_size: must be > 0, got 0"),
    ("learning_rate", -1e-3, "learning_rate: must be > 0, got -0.001"),
    ("discount", 1.5, "discount: must be in [0, 1], got 1.5"),
    ("discount", -0.1, "discount: must be in [0, 1], got -0.1"),
    ("epsilon_final", 2.0, "epsilon_final: must be in [0, 1], got 2.0"),
    ("burn_in", -1, "burn_in: must be >= 0, got -1"),
    ("hidden_sizes", (), "hidden_sizes: must be non-empty positive sizes, got ()"),
    ("hidden_sizes", (64, 0), "hidden_sizes: must be non-empty positive sizes, got (64, 0)"),
    ("torso", "vit", "torso: unknown torso 'vit'"),
    ("reward_clip", -1.0, "reward_clip: must be >= 0 (0: off), got -1.0"),
    ("value_clip_epsilon", -0.2, "value_clip_epsilon: must be >= 0, got -0.2"),
]


def _cases():
  for name in sorted(AGENTS):
    fields = get_agent(name).Config.__dataclass_fields__
    for field, value, message in AGENT_CASES:
      if field in fields:
        yield pytest.param(name, field, value, message, id=f"{name}-{field}={value!r}")


@pytest.mark.parametrize("agent,field,value,message", list(_cases()))
def test_agent_configs_name_the_bad_field(agent, field, value, message):
  config = get_agent(agent).Config
  config()  # the defaults are valid
  with pytest.raises(ConfigError) as raised:
    config(**{field: value})
  assert raised.value.field == field
  assert str(raised.value).startswith(message)


def test_every_agent_checks_its_network_and_its_shared_fields():
  checked = {case.values[0] for case in _cases() if case.values[1] in ("batch_size", "discount", "hidden_sizes")}
  assert checked == set(AGENTS)


@pytest.mark.parametrize("field,value,message", [
    ("num_actors", 0, "num_actors: must be > 0, got 0"),
    ("inference_timeout_ms", 0.0, "inference_timeout_ms: must be > 0, got 0.0"),
    ("max_restarts", -1, "max_restarts: must be >= 0, got -1"),
    ("progress_seconds", -0.5, "progress_seconds: must be >= 0, got -0.5"),
    ("service_deadline_seconds", 0.0, "service_deadline_seconds: must be > 0, got 0.0"),
])
def test_experiment_config_names_the_bad_field(field, value, message):
  with pytest.raises(ConfigError) as raised:
    ExperimentConfig(**{field: value})
  assert (raised.value.field, str(raised.value)) == (field, message)


def test_replay_spec_names_the_bad_field():
  with pytest.raises(ConfigError, match=r"^samples_per_insert: must be > 0, got 0.0$"):
    ReplaySpec(block_size=1, max_size=10, min_size=1, samples_per_insert=0.0)
  with pytest.raises(ConfigError, match=r"^max_size: must be > 0, got 0$"):
    ReplaySpec(block_size=1, max_size=0, min_size=1, samples_per_insert=1.0)
