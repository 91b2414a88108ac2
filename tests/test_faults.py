"""The fault tests' injection (jrl/run/distributed/faults.py): an environment variable, not a config field."""

import dataclasses
import json

import pytest

from jrl.errors import ConfigError
from jrl.run.distributed import faults


def test_the_variable_round_trips_and_names_the_point_of_failure():
  environ = {}
  faults.to_environment(faults.Faults(learner_after=20), environ)
  assert environ == {faults.ENV_VAR: "learner_after=20"}
  injected = faults.from_environment(environ)
  assert injected == faults.Faults(learner_after=20, actor_after=0)
  injected.check_learner(19)  # not yet
  with pytest.raises(RuntimeError, match=r"^injected learner failure after 20 calls \(crash_learner_after\)$"):
    injected.check_learner(20)
  injected.check_actor(0, 10**6)  # actors: not asked to fail


def test_only_actor_zero_fails_and_nothing_set_means_no_fault():
  injected = faults.parse("actor_after=400")
  injected.check_actor(1, 400)
  with pytest.raises(RuntimeError, match=r"after 401 env steps \(crash_actor_after\)"):
    injected.check_actor(0, 401)
  assert faults.from_environment({}) == faults.Faults()
  environ = {}
  faults.to_environment(faults.Faults(), environ)
  assert environ == {}


@pytest.mark.parametrize("text", ["learner_after", "learner=3", "actor_after=-1", "actor_after=x"])
def test_a_malformed_variable_names_it(text):
  with pytest.raises(ConfigError, match=rf"^{faults.ENV_VAR}: expected items like"):
    faults.parse(text)


def test_a_run_directory_of_an_older_version_with_the_fault_fields_still_loads(tmp_path):
  from jrl.agents import dqn
  from jrl.experiment.config import ExperimentConfig
  from jrl.experiment.files import CONFIG_FILE
  from jrl.experiment.resume import load_configs
  exp = ExperimentConfig(steps=1234, run_dir=str(tmp_path))
  saved = {"experiment": {**dataclasses.asdict(exp), "crash_learner_after": 0, "crash_actor_after": 0},
           "agent": dataclasses.asdict(dqn.Config())}
  (tmp_path / CONFIG_FILE).write_text(json.dumps(saved))
  loaded, agent_cfg = load_configs(str(tmp_path))
  assert loaded == exp and agent_cfg == dqn.Config()
  assert not hasattr(loaded, "crash_learner_after")
