"""The command line: bad input gets one clear line and exit status 2; --help lists every field."""

import argparse
import dataclasses
import os
import subprocess
import sys

import pytest

from jrl.agents import dqn
from jrl.compat import missing_distributed_stack
from jrl.experiment.config import ExperimentConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BAD_INPUTS = {
    "unknown env": (["--env", "NoSuchEnv-v0"], "env: unknown gymnasium id 'NoSuchEnv-v0'"),
    "unknown agent": (["--agent", "nope"], "agent: unknown agent 'nope'"),
    "continuous actions for dqn": (["--env", "Pendulum-v1"], "agent: dqn needs a Discrete action space"),
    "discrete actions for sac": (["--agent", "sac", "--env", "CartPole-v1"], "agent: sac needs a Box action space"),
    "discrete actions for td3": (["--agent", "td3", "--env", "CartPole-v1"], "agent: td3 needs a Box action space"),
    # Custom agent modules and env factories (examples/): the factory or module is named.
    "env factory raises": (["--env", "examples.envs:broken_factory"],
                           "env: the env factory 'examples.envs:broken_factory' raised RuntimeError: "
                           "this factory always fails"),
    "env factory returns a non-env": (["--env", "examples.envs:not_an_env"],
                                      "env: the env factory 'examples.envs:not_an_env' returned str, "
                                      "not a gymnasium.Env"),
    "env factory missing": (["--env", "examples.envs:nothing_here"],
                            "env: 'examples.envs:nothing_here': module 'examples.envs' has no function 'nothing_here'"),
    "agent module of no agent": (["--agent", "examples.envs"],
                                 "agent: module 'examples.envs' lacks Config, make_networks, make_learner, "
                                 "make_policy, make_replay_spec"),
    "agent module missing": (["--agent", "examples.no_agent"], "agent: cannot import agent module 'examples.no_agent'"),
    "zero steps": (["--steps", "0"], "steps: must be > 0, got 0"),
    "negative steps": (["--steps", "-5"], "steps: must be > 0, got -5"),
    "zero batch size": (["--batch_size", "0"], "batch_size: must be > 0, got 0"),
    "unknown field": (["--learning_rat", "0.1"], "unknown flag --learning_rat; did you mean --learning_rate?"),
    "bad value type": (["--steps", "many"], "argument --steps: expected a whole number (e.g. 100000, 1e5, 100k, "
                                            "2M), got 'many'"),
    # Flags a mode cannot honour.
    "deterministic distributed": (["--distributed", "--deterministic"],
                                  "--deterministic of the 'run' settings applies to embedded, device and device over "
                                  "hosts runs, not to a distributed run (Reverb's samplers cannot be seeded"),
    "log_every distributed": (["--distributed", "--log_every", "5"],
                              "--log_every of the 'run' settings applies to embedded, device and device over hosts "
                              "runs, not to a distributed run"),
    "num_actors embedded": (["--num_actors", "3"], "--num_actors belongs to the 'distributed' settings (the distributed "
                                                   "program), which an embedded run does not use: add --distributed "
                                                   "or drop it"),
    "fault injection embedded": (["--crash_learner_after", "5"], "crash_learner_after: applies to --distributed runs only"),
    "device distributed": (["--distributed", "--backend", "device"], "backend: 'device' is one compiled loop, not a Launchpad program"),
}
# Refused by the distributed launcher (it imports Launchpad) before anything launches.
BAD_DISTRIBUTED_INPUTS = {
    # Multi-host placement.
    "slurm without hosts": (["--distributed", "--launcher", "slurm"], "hosts: --launcher slurm needs the hosts"),
    "unknown launcher": (["--distributed", "--launcher", "mpi"], "launcher: must be 'local', 'slurm' or 'template'"),
    "unknown host": (["--distributed", "--launcher", "template", "--host_command", "{command}", "--hosts",
                      "a=127.0.0.1,b=127.0.0.2", "--placement", "replay,learner,counter,evaluator,actor=a inference=c"],
                     "placement: host 'c' is not in --hosts (a, b)"),
    "group unplaced": (["--distributed", "--launcher", "template", "--host_command", "{command}", "--hosts",
                        "a=127.0.0.1,b=127.0.0.2", "--placement", "replay,learner,counter,actor=a"],
                       "placement: group 'evaluator' is not placed on any host"),
    "learner processes unplaced": (["--distributed", "--launcher", "template", "--host_command", "{command}",
                                    "--hosts", "a=127.0.0.1,b=127.0.0.2", "--num_processes", "2", "--placement",
                                    "replay,learner,counter,evaluator,actor=a"],
                                   "placement: 2 learner processes (num_processes) but 1 learner host(s) placed"),
    "template host without address": (["--distributed", "--launcher", "template", "--host_command", "{command}",
                                       "--hosts", "a,b", "--placement", "replay,learner,counter,evaluator,actor=a"],
                                      "hosts: host 'a' has no address"),
}


def _launch(args):
  return subprocess.Popen([sys.executable, "-m", "launch.train", *args], cwd=ROOT, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _check_one_line_errors(cases, tmp_path):
  procs = {name: _launch([*args, "--run_dir", str(tmp_path / "never")]) for name, (args, _) in cases.items()}
  for name, proc in procs.items():
    out, err = proc.communicate(timeout=120)
    expected = cases[name][1]
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 2, (name, err)
    assert "Traceback" not in err, name
    assert len(lines) == 1, (name, err)
    assert lines[0].startswith("python -m launch.train: error: "), (name, lines)
    assert expected in lines[0], (name, lines)
  assert not (tmp_path / "never").exists()  # nothing was written for a refused run


@pytest.mark.slow
def test_bad_input_gives_one_line_and_status_2(tmp_path):
  _check_one_line_errors(BAD_INPUTS, tmp_path)


@pytest.mark.slow
@pytest.mark.needs_reverb
def test_bad_distributed_input_gives_one_line_and_status_2(tmp_path):
  _check_one_line_errors(BAD_DISTRIBUTED_INPUTS, tmp_path)


@pytest.mark.skipif(not missing_distributed_stack(), reason="the distributed stack is installed")
def test_a_core_install_refuses_what_needs_the_distributed_stack_in_one_line(tmp_path):
  """Where reverb/launchpad/TensorFlow are missing (the core stack), a Launchpad program (asked for by
  --engine launchpad or by a launcher of Launchpad's) and a run that asks for Reverb are refused up
  front in one line naming the full stack and how to get it; a plain --distributed runs on Ray and a
  plain run replays from the seeded buffer instead (tests/test_ray_engine.py, tests/test_core_stack.py)."""
  from jrl import compat
  here = compat.stack()
  core = (f"needs {compat.FULL_STACK_HINT}; this install is the core stack (Python {here.python}, JAX {here.jax}; "
          f"no {', '.join(missing_distributed_stack())})")
  _check_one_line_errors({
      "launchpad": (["--distributed", "--engine", "launchpad"], f"engine: --distributed on Launchpad {core}"),
      "slurm": (["--distributed", "--launcher", "slurm", "--hosts", "node1,node2"],
                f"launcher: --launcher slurm launches a Launchpad program, which needs {compat.FULL_STACK_HINT}; "
                "on Ray, start it on the hosts (`ray start`) and join it with --ray_address"),
      "reverb replay": (["--deterministic", "false"],
                        f"deterministic: a run without --deterministic (Reverb replay) {core}"),
  }, tmp_path)


def test_an_agent_module_missing_one_piece_is_named(tmp_path):
  package = tmp_path / "mine"
  package.mkdir()
  (package / "__init__.py").write_text("")
  (package / "agent.py").write_text("from examples.my_agent import Config, make_networks, make_learner, make_policy\n")
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), ROOT])}
  out = subprocess.run([sys.executable, "-m", "launch.train", "--agent", "mine.agent", "--run_dir",
                        str(tmp_path / "never")], cwd=ROOT, env=env, text=True, capture_output=True, timeout=120)
  assert out.returncode == 2 and out.stderr.strip().splitlines() == [
      "python -m launch.train: error: agent: module 'mine.agent' lacks make_replay_spec "
      "(an agent module provides Config, make_networks, make_learner, make_policy, make_replay_spec)"]
  assert not (tmp_path / "never").exists()


def test_help_lists_every_config_field():
  out = subprocess.run([sys.executable, "-m", "launch.train", "--help"], cwd=ROOT, text=True,
                       capture_output=True, timeout=120)
  assert out.returncode == 0
  for cls in (ExperimentConfig, dqn.Config):
    for field in dataclasses.fields(cls):
      assert f"--{field.name}" in out.stdout, field.name
  # The fault tests' flags (jrl/run/distributed/faults.py) work but are not listed: no run is meant to crash.
  assert "--crash_" not in out.stdout
  # One heading per concern, in order; every help text whole (a field's comment may run on over lines).
  from jrl.experiment.config import FIELD_GROUPS
  headings = [line for line in out.stdout.splitlines() if line.endswith(":") and not line.startswith(" ")]
  assert headings[1:1 + len(FIELD_GROUPS)] == [f"{name}: {text}:" for name, text, _ in FIELD_GROUPS], headings
  assert "step (2: halves; pays for CNNs) (default 1)" in out.stdout


def test_flags_override_fields():
  from launch.cli import OneLineParser, add_dataclass_flags, build_config
  parser = OneLineParser()
  add_dataclass_flags(parser, dqn.Config, "dqn")
  cfg = build_config(dqn.Config, parser.parse_args(["--hidden_sizes", "32,16", "--dueling", "--prioritized=false",
                                                     "--learning_rate", "3e-4"]))
  assert cfg == dqn.Config(hidden_sizes=(32, 16), dueling=True, prioritized=False, learning_rate=3e-4)


def test_integer_flags_take_scientific_notation_and_k_m_suffixes_exactly():
  from launch.cli import parse_int
  assert [parse_int(t) for t in ("100000", "100_000", "1e5", "1E5", "100k", "2M", "2.5M", "0.5k", "-5")] == \
      [100_000, 100_000, 100_000, 100_000, 100_000, 2_000_000, 2_500_000, 500, -5]
  for text in ("1.5e0", "0.0005k", "1.0000000000000001e0", "many", "inf", "nan", "", "k", "3/1", "0x10"):
    with pytest.raises(argparse.ArgumentTypeError, match="expected a whole number"):
      parse_int(text)


def _refused(args, folder, env=None):
  """The stderr lines of `launch.train ARGS` as a user types it, which must be refused (status 2)
  before anything is written (into `folder`/never)."""
  never = os.path.join(folder, "never")
  out = subprocess.run([sys.executable, "-m", "launch.train", *args, "--run_dir", never], cwd=ROOT, env=env,
                       text=True, capture_output=True, timeout=120)
  assert out.returncode == 2 and not os.path.exists(never), (out.returncode, out.stderr[-2000:])
  return out.stderr.strip().splitlines()


def test_step_counts_are_read_as_people_write_them_and_fractions_are_refused(tmp_path):
  # Values the config checks: the error shows what the flags were read as (1e1 -> 10, 0.012k -> 12).
  assert _refused(["--num_envs", "1e1", "--env_groups", "3"], tmp_path) == [
      "python -m launch.train: error: env_groups: must be >= 1 and divide num_envs=10, got 3"]
  assert _refused(["--num_envs", "0.012k", "--env_groups", "5"], tmp_path) == [
      "python -m launch.train: error: env_groups: must be >= 1 and divide num_envs=12, got 5"]
  assert _refused(["--steps", "1.5e0"], tmp_path) == [
      "python -m launch.train: error: argument --steps: expected a whole number (e.g. 100000, 1e5, 100k, 2M), "
      "got '1.5e0'"]
  assert _refused(["--min_replay_size", "2.5"], tmp_path) == [
      "python -m launch.train: error: argument --min_replay_size: expected a whole number (e.g. 100000, 1e5, 100k, "
      "2M), got '2.5'"]


def test_a_misspelled_flag_gets_a_did_you_mean(tmp_path):
  assert _refused(["--learning_rat", "0.1"], tmp_path) == [
      "python -m launch.train: error: unknown flag --learning_rat; did you mean --learning_rate?"]
  assert _refused(["--stesp=5000"], tmp_path) == [
      "python -m launch.train: error: unknown flag --stesp; did you mean --steps?"]
  # Nothing close: no guess. The fault tests' hidden flags (jrl/run/distributed/faults.py) are never suggested.
  assert _refused(["--zzzzzz"], tmp_path) == [
      "python -m launch.train: error: unknown flag --zzzzzz; see --help for the flags"]
  assert _refused(["--crash_learner_afte", "3"], tmp_path) == [
      "python -m launch.train: error: unknown flag --crash_learner_afte; see --help for the flags"]


def _path_without(commands, folder):
  """PATH with `commands` hidden: each PATH folder that holds one is replaced by a folder of links to
  everything else in it (this machine may have Slurm installed in /usr/bin)."""
  entries = []
  for i, entry in enumerate(os.environ.get("PATH", "").split(os.pathsep)):
    if not any(os.path.exists(os.path.join(entry, c)) for c in commands):
      entries.append(entry)
      continue
    copy = folder / f"path{i}"
    copy.mkdir()
    for name in os.listdir(entry):
      if name not in commands:
        os.symlink(os.path.join(entry, name), copy / name)
    entries.append(str(copy))
  return os.pathsep.join(entries)


@pytest.mark.needs_reverb
def test_the_slurm_launcher_without_slurm_says_so_in_one_line(tmp_path):
  from launch.cluster import SLURM_COMMANDS
  env = {**os.environ, "PATH": _path_without(SLURM_COMMANDS, tmp_path)}
  assert _refused(["--distributed", "--launcher", "slurm", "--hosts", "node1,node2"], tmp_path, env) == [
      "python -m launch.train: error: launcher: Slurm's commands (scontrol, sbatch, squeue, scancel) are not "
      "installed here: --launcher slurm needs a Slurm cluster (without one: --launcher template --host_command "
      "'ssh {host} {command}')"]
  # Addresses given (no scontrol needed to find them): still refused before the job is written.
  refused = _refused(["--distributed", "--launcher", "slurm", "--hosts", "a=10.0.0.1,b=10.0.0.2"], tmp_path, env)
  assert refused[0].startswith("python -m launch.train: error: launcher: Slurm's commands"), refused
