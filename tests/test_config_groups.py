"""The experiment config by concern (jrl/experiment/config.py): its groups' dataclasses, the run's
mode, a field given for a mode that does not use it refused naming its group, and everything that
read the flat config before: the same flags, `exp.steps`, `dataclasses.replace`, old config.json."""

import dataclasses
import glob
import json
import os
import re
import subprocess
import sys

import pytest

from jrl.errors import ConfigError
from jrl.experiment import config
from jrl.experiment.config import (DEVICE, DEVICE_HOSTS, DISTRIBUTED, EMBEDDED, FIELD_GROUPS, GROUPS,
                                   DistributedSettings, ExperimentConfig, LauncherSettings, RunSettings,
                                   WrongModeError)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# `python -m launch.train --help`'s flags, by heading, recorded at 9b2b4f1 before the groups became
# dataclasses. --actor_device came after (31d56f0, a field of its own in the run group).
HELP_AT_9B2B4F1 = {
    "options": ["--help", "--verbose", "--list_presets"],
    "run": ["--agent", "--env", "--seed", "--steps", "--run_dir", "--preset", "--deterministic", "--num_envs",
            "--env_groups", "--eval_every", "--eval_episodes", "--stop_at_threshold", "--reward_threshold",
            "--log_every", "--progress_seconds"],
    "learner": ["--updates_per_call", "--learner_devices", "--coordinator_address", "--num_processes", "--process_id",
                "--prefetch"],
    "checkpoints": ["--resume", "--resume_strict", "--checkpoint_every_seconds", "--checkpoint_every_steps",
                    "--keep_checkpoints"],
    "distributed": ["--distributed", "--num_actors", "--inference", "--num_inference_servers",
                    "--inference_timeout_ms", "--variable_update_period", "--lp_launch_type", "--max_restarts",
                    "--restart_backoff_seconds", "--service_deadline_seconds"],
    "launcher": ["--launcher", "--hosts", "--placement", "--host_command", "--host_deadline_seconds"],
    "device": ["--backend"],
    "agent": ["--discount", "--n_step", "--double_q", "--huber_delta", "--target_update_period",
              "--target_update_tau", "--learning_rate", "--adam_eps", "--max_grad_norm", "--batch_size",
              "--hidden_sizes", "--dueling", "--torso", "--reward_clip", "--epsilon_init", "--epsilon_final",
              "--epsilon_decay_steps", "--eval_epsilon", "--min_replay_size", "--max_replay_size",
              "--samples_per_insert", "--block_size", "--prioritized", "--priority_exponent",
              "--importance_exponent"],
}
# heading: {flag: the flag added after it}; --engine and --ray_address came with the Ray engine.
ADDED_SINCE = {"run": {"--env_groups": "--actor_device"},
               "distributed": {"--distributed": "--engine", "--service_deadline_seconds": "--ray_address"}}

# What the hand-kept sets said at 9b2b4f1 (EMBEDDED_ONLY, DISTRIBUTED_ONLY, HOST_FIELDS), which the
# groups replace; actor_device joined EMBEDDED_ONLY in 31d56f0.
OLD_EMBEDDED_ONLY = {"deterministic", "log_every", "process_id", "actor_device"}
OLD_DISTRIBUTED_ONLY = {"num_actors", "inference", "num_inference_servers", "inference_timeout_ms",
                        "variable_update_period", "lp_launch_type", "launcher", "hosts", "placement", "host_command",
                        "host_deadline_seconds", "max_restarts", "restart_backoff_seconds", "service_deadline_seconds"}
OLD_HOST_FIELDS = {"launcher", "hosts", "placement", "host_command", "host_deadline_seconds"}
# Distributed-only fields added since, which the old rule would have listed there.
OLD_DISTRIBUTED_ONLY |= {"engine", "ray_address"}

# One config of each mode.
RUNS = {
    EMBEDDED: ExperimentConfig(),
    DISTRIBUTED: ExperimentConfig(distributed=True),
    DEVICE: ExperimentConfig(backend="device", env="gymnax:CartPole-v1"),
    DEVICE_HOSTS: ExperimentConfig(backend="device", env="gymnax:CartPole-v1", launcher="template",
                                   hosts="a=127.0.0.1,b=127.0.0.1", host_command="{command}"),
}


def _help_flags(text):
  """{heading's first word: flags in order} of a --help text."""
  flags, heading = {}, None
  for line in text.splitlines():
    if line and not line.startswith(" ") and line.endswith(":") and not line.startswith("usage"):
      heading = re.split(r"[: ]", line)[0]
      flags[heading] = []
    match = re.match(r"^  (?:-h, )?(--[a-z0-9_]+)(?= |$)", line)  # not a heading's note naming a flag
    if match and heading:
      flags[heading].append(match.group(1))
  return flags


def test_help_offers_the_flags_it_offered_before_the_groups():
  out = subprocess.run([sys.executable, "-m", "launch.train", "--help"], cwd=ROOT, text=True, capture_output=True,
                       timeout=120)
  assert out.returncode == 0, out.stderr
  expected = {heading: list(flags) for heading, flags in HELP_AT_9B2B4F1.items()}
  for heading, added in ADDED_SINCE.items():
    for after, flag in added.items():
      expected[heading].insert(expected[heading].index(after) + 1, flag)
  assert _help_flags(out.stdout) == expected
  # Each heading says which runs use its group, as the group declares it.
  assert "used by distributed and device over hosts runs; --launcher: all but embedded" in " ".join(out.stdout.split())


def test_the_groups_are_the_configs_fields_once_each_and_the_help_headings():
  assert [g.name for g in GROUPS] == ["run", "learner", "checkpoints", "distributed", "launcher", "device"]
  names = [f.name for f in dataclasses.fields(ExperimentConfig)]
  assert sorted(names) == sorted(n for g in GROUPS for n in g.fields()) and len(set(names)) == len(names)
  assert names[:4] == ["agent", "env", "seed", "steps"] and names[-1] == "backend"  # the groups' order
  assert FIELD_GROUPS[3] == ("distributed", "the distributed program (--distributed)", tuple(
      f.name for f in dataclasses.fields(DistributedSettings)))
  assert config.GROUP_OF["num_actors"].cls is DistributedSettings and config.GROUP_OF["hosts"].cls is LauncherSettings
  # Defaults and help comments are the groups' own.
  from launch.cli import _field_doc
  assert ExperimentConfig().service_deadline_seconds == DistributedSettings().service_deadline_seconds == 60.0
  assert _field_doc(ExperimentConfig, "env_groups") == _field_doc(RunSettings, "env_groups") == (
      "the actor's envs step as this many groups in turn, each group's next actions computed while the others "
      "step (2: halves; pays for CNNs)")


def test_the_mode_is_one_value_derived_from_the_mode_flags():
  assert {name: (exp.mode, exp.scope, exp.over_hosts) for name, exp in RUNS.items()} == {
      EMBEDDED: (EMBEDDED, EMBEDDED, False), DISTRIBUTED: (DISTRIBUTED, DISTRIBUTED, False),
      DEVICE: (DEVICE, DEVICE, False), DEVICE_HOSTS: (DEVICE, DEVICE_HOSTS, True)}
  slurm = ExperimentConfig(distributed=True, launcher="slurm", hosts="n1,n2")
  assert (slurm.mode, slurm.scope, slurm.over_hosts) == (DISTRIBUTED, DISTRIBUTED, True)
  # Flags that contradict each other are refused before the groups' own checks.
  with pytest.raises(ConfigError, match=r"^backend: 'device' is one compiled loop"):
    ExperimentConfig(distributed=True, backend="device", steps=0)
  with pytest.raises(ConfigError, match=r"^launcher: 'slurm' launches a distributed program or a device run over "):
    ExperimentConfig(launcher="slurm")


def test_a_groups_view_is_its_dataclass_and_is_checked_when_made():
  exp = ExperimentConfig(distributed=True, num_actors=6, inference="server")
  view = exp.settings("distributed")
  assert type(view) is DistributedSettings and (view.num_actors, view.inference, view.max_restarts) == (6, "server", 3)
  assert exp.settings(LauncherSettings) == LauncherSettings()
  with pytest.raises(ConfigError, match=r"^num_actors: must be > 0, got 0$"):
    DistributedSettings(num_actors=0)
  with pytest.raises(ConfigError, match=r"^hosts: --launcher slurm needs the hosts"):
    LauncherSettings(launcher="slurm")
  with pytest.raises(KeyError, match="no settings group 'replay'"):
    exp.settings("replay")


def test_the_flat_config_reads_and_replaces_as_before():
  exp = ExperimentConfig(steps=1234, num_actors=3, distributed=True)
  assert (exp.steps, exp.num_actors, exp.hosts) == (1234, 3, "")
  changed = dataclasses.replace(exp, steps=99, process_id=0)
  assert (changed.steps, changed.num_actors, changed.mode) == (99, 3, DISTRIBUTED)
  with pytest.raises(ConfigError, match=r"^steps: must be > 0, got 0$"):
    dataclasses.replace(exp, steps=0)
  with pytest.raises(dataclasses.FrozenInstanceError):
    exp.steps = 5
  assert exp == ExperimentConfig(**dataclasses.asdict(exp)) and hash(exp) == hash(ExperimentConfig(
      **dataclasses.asdict(exp)))


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "tests", "data", "*", "*", "config.json"))),
                         ids=lambda path: os.path.basename(os.path.dirname(path)))
def test_an_old_flat_config_json_still_loads(path):
  from jrl.experiment.resume import RETIRED_FIELDS, load_configs
  with open(path) as f:
    saved = json.load(f)["experiment"]
  exp, _ = load_configs(os.path.dirname(path))
  for name, value in saved.items():
    if name not in RETIRED_FIELDS:
      assert getattr(exp, name) == (tuple(value) if isinstance(value, list) else value), name
  for name in set(f.name for f in dataclasses.fields(ExperimentConfig)) - set(saved):  # fields added since
    assert getattr(exp, name) == ExperimentConfig.__dataclass_fields__[name].default, name
  assert exp.mode == (DEVICE if saved["backend"] == "device" else DISTRIBUTED if saved["distributed"] else EMBEDDED)


def test_config_json_round_trips_through_the_flat_keys():
  from jrl.agents import dqn
  from jrl.experiment.files import config_payload
  from jrl.experiment.resume import config_from_dict
  exp = RUNS[DEVICE_HOSTS]
  payload = json.loads(json.dumps(config_payload(exp, dqn.Config())))
  assert set(payload["experiment"]) == set(config.GROUP_OF) and payload["experiment"]["host_command"] == "{command}"
  assert config_from_dict(ExperimentConfig, payload["experiment"], "test") == exp


def _old_rule_refuses(exp, name):
  """What check_given_flags refused at 9b2b4f1 (with actor_device from 31d56f0)."""
  if exp.distributed and name in OLD_EMBEDDED_ONLY:
    return True
  return not exp.distributed and name in OLD_DISTRIBUTED_ONLY and not (exp.backend == "device"
                                                                       and name in OLD_HOST_FIELDS)


def test_the_groups_refuse_what_the_hand_kept_sets_refused_and_a_device_runs_launcher_settings():
  refused = {mode: set() for mode in RUNS}
  old = {mode: set() for mode in RUNS}
  for mode, exp in RUNS.items():
    for name in config.GROUP_OF:
      try:
        exp.check_given_flags([name])
      except WrongModeError as error:
        assert error.field == name and error.group == config.GROUP_OF[name].name
        refused[mode].add(name)
      if _old_rule_refuses(exp, name):
        old[mode].add(name)
  assert refused[EMBEDDED] == old[EMBEDDED] and refused[DISTRIBUTED] == old[DISTRIBUTED]
  assert refused[DEVICE_HOSTS] == old[DEVICE_HOSTS] | {"actor_device"}
  # New: a device run on one host does not take where hosts are (the launcher's settings) nor the
  # embedded runner's actor device; it did take them, and did nothing with them.
  assert refused[DEVICE] - old[DEVICE] == {"hosts", "placement", "host_command", "host_deadline_seconds",
                                           "actor_device"}
  assert old[DEVICE] <= refused[DEVICE]


@pytest.mark.parametrize("mode,name,message", [
    (EMBEDDED, "num_actors", "--num_actors belongs to the 'distributed' settings (the distributed program), which an "
                             "embedded run does not use: add --distributed or drop it"),
    (EMBEDDED, "placement", "--placement belongs to the 'launcher' settings (where a run's processes go), which an "
                            "embedded run does not use: add --distributed or drop it"),
    (DEVICE, "hosts", "--hosts belongs to the 'launcher' settings (where a run's processes go), which a device run "
                      "on one host does not use: add --launcher slurm (or template) or drop it"),
    (DEVICE_HOSTS, "max_restarts", "--max_restarts belongs to the 'distributed' settings (the distributed program), "
                                   "which a device run over hosts does not use: use --distributed instead of "
                                   "--backend device or drop it"),
    (DISTRIBUTED, "process_id", "--process_id of the 'learner' settings applies to embedded, device and device over "
                                "hosts runs, not to a distributed run (a distributed program numbers its learner "
                                "processes itself): drop --distributed or drop it"),
])
def test_a_field_for_another_mode_is_refused_naming_its_group(mode, name, message):
  with pytest.raises(WrongModeError) as raised:
    RUNS[mode].check_given_flags(["steps", name])
  assert str(raised.value) == message and isinstance(raised.value, ConfigError)
  RUNS[mode].check_given_flags(["steps", "seed", "resume", "backend", "distributed"])  # every mode's


@pytest.mark.slow
def test_a_field_given_for_the_wrong_mode_fails_in_one_line_and_writes_nothing(tmp_path):
  """As users type it: from their own folder, no --run_dir (the run would go to ./runs/...)."""
  env = {**os.environ, "PYTHONPATH": ROOT}
  cases = {
      ("--num_actors", "3"): "--num_actors belongs to the 'distributed' settings (the distributed program), which an "
                             "embedded run does not use: add --distributed or drop it",
      ("--backend", "device", "--env", "gymnax:CartPole-v1", "--hosts", "a,b"):
          "--hosts belongs to the 'launcher' settings (where a run's processes go), which a device run on one host "
          "does not use: add --launcher slurm (or template) or drop it",
      ("--distributed", "--log_every", "500"):
          "--log_every of the 'run' settings applies to embedded, device and device over hosts runs, not to a "
          "distributed run (distributed nodes write a metrics row every second): drop --distributed or drop it",
  }
  for args, message in cases.items():
    cwd = tmp_path / args[0].strip("-")
    cwd.mkdir()
    out = subprocess.run([sys.executable, "-m", "launch.train", *args, "--steps", "1000"], cwd=cwd, env=env,
                         text=True, capture_output=True, timeout=120)
    assert out.returncode == 2, (args, out.stderr)
    assert out.stderr.splitlines() == [f"python -m launch.train: error: {message}"], (args, out.stderr)
    assert out.stdout == "" and os.listdir(cwd) == [], (args, os.listdir(cwd))


def test_the_flags_page_lists_each_groups_modes():
  with open(os.path.join(ROOT, "docs", "training.md")) as f:
    page = f.read()
  for entry in GROUPS:
    assert f"| `{entry.name}` | {entry.used_by()} |" in page, entry.name
