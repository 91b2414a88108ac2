"""The core stack (Python 3.11-3.13, current JAX; no Reverb, Launchpad or TensorFlow) as a user meets it:
a plain `launch.train`, as `make train` types it, replays from the seeded buffer and says so; the
README's commands that need the full stack say so in one line and write nothing. These run where the
stack is the core (`make test` in .ci/core_stack_front_door's view, `make test-core`); the full stack's
own behaviour is tested everywhere else."""

import json
import os
import pathlib
import shlex
import subprocess
import sys

import pytest

from jrl import compat

pytestmark = pytest.mark.skipif(compat.stack().name != "core", reason="the core stack's behaviour (Reverb here)")

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _train(*args, cwd):
  return subprocess.run([sys.executable, "-m", "launch.train", *args], cwd=cwd, capture_output=True, text=True,
                        timeout=600)


def test_a_plain_run_replays_from_the_seeded_buffer_and_its_summary_names_the_stack(tmp_path):
  import jax
  out = _train("--steps", "1600", "--eval_every", "1600", "--eval_episodes", "2", "--progress_seconds", "0",
               "--run_dir", "rel/run", cwd=tmp_path)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  assert out.stdout.splitlines()[0] == ("[run] Reverb is not installed (the core stack): replay is the seeded "
                                        "in-process buffer, as with --deterministic")
  run_dir = tmp_path / "rel" / "run"
  summary = json.loads((run_dir / "summary.json").read_text())
  here = compat.stack()
  assert (summary["stack"], summary["python_version"], summary["jax_version"]) == ("core", here.python, jax.__version__)
  assert summary["replay"] == "seeded" and summary["actor_steps"] == 1600
  # What ran is what config.json says: a resume (or a rerun from it) replays from the same buffer.
  assert json.loads((run_dir / "config.json").read_text())["experiment"]["deterministic"] is True


def _readme_commands_needing_the_full_stack():
  """The README's commands that launch a Launchpad program (a launcher of Launchpad's); its plain
  --distributed runs on Ray on this stack (tests/test_ray_engine.py runs it)."""
  sys.path.insert(0, str(ROOT / "tests"))
  import test_readme  # the README's commands, as its test finds them
  return [c for c in test_readme.COMMANDS if c.startswith(".venv/bin/python") and "--launcher" in c]


def test_the_readme_has_a_launchpad_only_command_to_check():
  assert _readme_commands_needing_the_full_stack(), "the README's Slurm command is the one this file checks"


@pytest.mark.parametrize("command", _readme_commands_needing_the_full_stack())
def test_the_readmes_launchpad_commands_name_the_full_stack_in_one_line(command):
  before = set(os.listdir(ROOT / "runs")) if (ROOT / "runs").is_dir() else set()
  words = shlex.split(command)
  out = subprocess.run([sys.executable, *words[1:]], cwd=ROOT, capture_output=True, text=True, timeout=300)
  lines = [line for line in out.stderr.splitlines() if line.strip()]
  assert out.returncode == 2 and len(lines) == 1, out.stdout[-2000:] + out.stderr[-3000:]
  assert lines[0].startswith("python -m launch.train: error: ") and compat.FULL_STACK_HINT in lines[0], lines
  after = set(os.listdir(ROOT / "runs")) if (ROOT / "runs").is_dir() else set()
  assert after == before  # nothing written
