"""Presets (jrl/agents/<agent>/presets.yaml): a named hyperparameter set applied before the
command's own flags, which win; recorded in full in config.json; listed by --list_presets; bad
names in one line. The reference table's rows are `--preset minatar` plus the seed and budget."""

import json
import os
import subprocess
import sys

import pytest

from jrl.agents import dqn, ppo
from jrl.errors import ConfigError
from jrl.experiment.config import ExperimentConfig
from jrl.experiment.files import config_payload
from jrl.experiment.presets import find_preset, load_presets

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The reference table's rows as their commands spell them out (docs/results.md; first the records of
# 2026-12-02, before presets existed; since 2026-12-06 PPO's evaluations sample the policy and DQN
# takes 1-step max-Q targets): the presets must be these settings.
DQN_ROW = ["--num_envs", "8", "--batch_size", "32", "--samples_per_insert", "8", "--updates_per_call", "8",
           "--learning_rate", "0.00025", "--n_step", "1", "--double_q", "false", "--epsilon_final", "0.1",
           "--min_replay_size", "5000", "--max_replay_size", "100000",
           "--epsilon_decay_steps", "100000", "--target_update_period", "1000", "--deterministic"]
PPO_ROW = ["--backend", "device", "--num_envs", "64", "--batch_size", "64", "--sequence_length", "128",
           "--num_minibatches", "8", "--num_epochs", "4", "--learning_rate", "5e-4", "--discount", "0.999",
           "--gae_lambda", "0.95", "--entropy_cost", "0.01", "--max_grad_norm", "0.5", "--hidden_sizes", "256,256",
           "--torso", "mlp", "--greedy_eval", "false"]


def _configs(agent, env, argv):
  """(experiment, agent config) as launch.train builds them from a command line."""
  from launch.sweep import check_train_flags
  return check_train_flags(agent, env, 0, argv)


def _payload(agent, env, argv, drop=("preset",)):
  exp, cfg = _configs(agent, env, argv)
  payload = json.loads(json.dumps(config_payload(exp, cfg)))
  for field in drop:
    payload["experiment"].pop(field)
  return payload


@pytest.mark.parametrize("agent, env, row", [("dqn", "MinAtar/Breakout-v1", DQN_ROW),
                                             ("ppo", "gymnax:Breakout-MinAtar", PPO_ROW)])
def test_the_minatar_preset_is_the_reference_rows_settings(agent, env, row):
  assert _payload(agent, env, ["--preset", "minatar"]) == _payload(agent, env, row)
  exp, _ = _configs(agent, env, ["--preset", "minatar"])
  assert exp.preset == "minatar"
  from bench.reference import SETTINGS, short_command
  assert SETTINGS[agent]["flags"] == row
  assert short_command("python -m launch.sweep --steps 9 " + " ".join(row), agent) == \
      "python -m launch.sweep --steps 9 --preset minatar"


def test_ppo_anchors_are_gymnax_blines_logs_at_the_budget_as_hand_worked():
  """The reference table's PPO anchors: gymnax-blines' logged returns, linear between the points
  around the budget, the last point's beyond the log's end."""
  from bench.reference import GYMNAX_BLINES_PPO_LOG, PUBLISHED, logged_at
  # Asterix at 1M: 1.799 + (2.140 - 1.799) * (1,000,000 - 959,936) / 320,000 = 1.8417.
  assert PUBLISHED["ppo"]["at"][1_000_000] == {"breakout": 16.52, "asterix": 1.84, "freeway": 29.19,
                                               "spaceinvaders": 51.38}
  assert PUBLISHED["ppo"]["at"][10_000_000]["asterix"] == 14.95  # past 9,919,936, its last point
  log = GYMNAX_BLINES_PPO_LOG["freeway"]
  assert (logged_at(log, 959_936), logged_at(log, 1_279_936), logged_at(log, 100)) == (29.04, 30.25, 29.04)
  assert logged_at(log, 1_119_936) == 29.65  # halfway: (29.043 + 30.250) / 2


def test_a_preset_overrides_defaults_and_the_users_flags_override_the_preset():
  exp, cfg = _configs("dqn", "MinAtar/Breakout-v1", ["--preset", "minatar"])
  defaults = dqn.Config()
  assert (cfg.learning_rate, cfg.min_replay_size, exp.num_envs, exp.deterministic) == (2.5e-4, 5000, 8, True)
  assert (cfg.n_step, cfg.double_q) == (1, False)
  assert defaults.min_replay_size != 5000 and defaults.n_step != 1 and defaults.double_q  # the preset changed them
  exp, cfg = _configs("dqn", "MinAtar/Breakout-v1", ["--learning_rate", "1e-3", "--preset", "minatar",
                                                     "--num_envs", "4", "--deterministic", "false"])
  assert (cfg.learning_rate, exp.num_envs, exp.deterministic) == (1e-3, 4, False)  # the user's, wherever written
  assert (cfg.min_replay_size, cfg.target_update_period) == (5000, 1000)  # the rest, the preset's
  exp, cfg = _configs("ppo", "gymnax:Breakout-MinAtar", ["--preset", "minatar", "--hidden_sizes", "64,64"])
  assert cfg.hidden_sizes == (64, 64) and cfg.sequence_length == 128 and exp.backend == "device"
  assert ppo.Config().sequence_length != 128


def _train(args, cwd):
  return subprocess.run([sys.executable, "-m", "launch.train", *args], cwd=cwd, capture_output=True, text=True,
                        timeout=300, env={**os.environ, "PYTHONPATH": ROOT})


@pytest.mark.parametrize("args, message", [
    (["--agent", "dqn", "--preset", "mujoco"],
     "python -m launch.train: error: preset: no preset 'mujoco' (dqn's presets: atari, minatar)"),
    (["--agent", "pqn", "--preset", "minatar"],
     "python -m launch.train: error: preset: 'minatar' is a preset of dqn, ppo, not of pqn (pqn has no presets)"),
])
def test_an_unknown_preset_or_another_agents_is_one_line_and_writes_nothing(args, message, tmp_path):
  done = _train([*args, "--run_dir", "run"], tmp_path)
  assert done.returncode == 2 and done.stderr.strip().splitlines() == [message], done.stderr
  assert os.listdir(tmp_path) == []


def test_list_presets_prints_each_preset_with_its_flags(tmp_path):
  done = _train(["--agent", "ppo", "--list_presets"], tmp_path)
  assert done.returncode == 0, done.stderr
  assert done.stdout.startswith("ppo's presets (--preset NAME; your own flags win over a preset's):\nminatar: ")
  assert "  flags: " + " ".join(PPO_ROW) in done.stdout and "gymnax:Asterix-MinAtar" in done.stdout
  assert os.listdir(tmp_path) == []


def test_a_resumed_run_keeps_its_config_and_refuses_a_preset(tmp_path):
  done = _train(["--resume", str(tmp_path / "somewhere"), "--preset", "minatar"], tmp_path)
  assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_an_agent_modules_own_presets_file_is_read_and_checked(tmp_path, monkeypatch):
  package = tmp_path / "mine"
  package.mkdir()
  (package / "__init__.py").write_text("")
  (package / "agent.py").write_text("from jrl.agents.dqn import *  # noqa\n"
                                    "from jrl.agents.dqn import Config, make_networks, make_learner, make_policy, "
                                    "make_replay_spec\n")
  (package / "agent.presets.yaml").write_text("fast:\n  description: a quick one\n  flags: {learning_rate: 1e-2}\n"
                                              "typo:\n  flags: {learning_rat: 1e-2}\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  from jrl.agents import get_agent
  module = get_agent("mine.agent")
  fields = ("learning_rate", "num_envs")
  with pytest.raises(ConfigError, match=r"^preset: .*agent\.presets\.yaml: preset 'typo' sets 'learning_rat', not a "
                                        r"field of the experiment config or of the mine.agent config$"):
    load_presets("mine.agent", module, fields)
  (package / "agent.presets.yaml").write_text("fast:\n  description: a quick one\n  flags: {learning_rate: 1e-2}\n")
  assert find_preset("fast", "mine.agent", module, fields).argv() == ["--learning_rate", "1e-2"]
  (package / "agent.presets.yaml").write_text("fast:\n  flags: {seed: 3}\n")
  with pytest.raises(ConfigError, match="sets 'seed', which the command chooses"):
    load_presets("mine.agent", module)
  assert ExperimentConfig().preset == ""


@pytest.mark.slow  # a real command: a short MinAtar run (MinAtar's env, its replay not yet filled)
def test_the_readme_style_command_writes_the_rows_settings_into_config_json(tmp_path):
  """`launch.train --agent dqn --preset minatar --env MinAtar/Breakout-v1` as typed (a short budget):
  its config.json is the reference row's settings, seed and budget aside, with the preset named."""
  done = _train(["--agent", "dqn", "--preset", "minatar", "--env", "MinAtar/Breakout-v1", "--steps", "400",
                 "--eval_every", "400", "--eval_episodes", "1", "--run_dir", "run"], tmp_path)
  assert done.returncode == 0, done.stderr[-3000:]
  with open(tmp_path / "run" / "config.json") as f:
    written = json.load(f)
  assert written["experiment"]["preset"] == "minatar"
  expected = _payload("dqn", "MinAtar/Breakout-v1", [*DQN_ROW, "--steps", "400", "--eval_every", "400",
                                                     "--eval_episodes", "1"], drop=())
  for payload in (written, expected):
    for field in ("preset", "run_dir", "seed", "steps"):
      payload["experiment"].pop(field)
  assert written == expected
