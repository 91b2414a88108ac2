"""Start-up and exit of the command line: what a run loads, and how soon it ends after `done:`."""

import json
import os
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Exit after the `done:` line takes ~0.1 s (the interpreter's teardown is skipped once the
# run has written everything) and ~1.2 s without that; Reverb runs used to hang 20-46 s
# there (tf.data's autotuning thread, waited out by the sampler's destructor). 3 s leaves
# room for a loaded two-core CI machine and is far below the hang.
EXIT_LIMIT_S = 3.0


def test_a_deterministic_run_loads_neither_tensorflow_nor_reverb(tmp_path):
  code = ("import sys\n"
          "from launch.train import main\n"
          f"main(['--deterministic', '--steps', '200', '--min_replay_size', '100', '--eval_episodes', '1', "
          f"'--progress_seconds', '0', '--run_dir', {str(tmp_path / 'run')!r}])\n"
          "print(sorted(m for m in ('tensorflow', 'reverb', 'keras', 'launchpad') if m in sys.modules))\n")
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


@pytest.mark.slow
@pytest.mark.needs_reverb
def test_a_reverb_run_stopped_at_its_threshold_exits_right_after_done(tmp_path):
  """The case that hung: Reverb replay, stopped early by --stop_at_threshold."""
  run_dir = tmp_path / "run"
  # Before the fix this command ended 5 s after its done: line here (28-46 s for longer runs).
  cmd = [sys.executable, "-u", "-m", "launch.train", "--steps", "100000", "--eval_every", "3000",
         "--stop_at_threshold", "--reward_threshold", "5", "--progress_seconds", "1", "--run_dir", str(run_dir)]
  proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  done_at, lines = None, []
  for line in proc.stdout:
    lines.append(line)
    if "] done:" in line:
      done_at = time.monotonic()
  proc.wait(timeout=300)
  exited = time.monotonic()
  assert proc.returncode == 0 and done_at is not None, "".join(lines[-20:])
  summary = json.load(open(run_dir / "summary.json"))
  assert summary["replay"] == "reverb" and summary["actor_steps"] == 3000  # stopped at the first evaluation
  assert exited - done_at < EXIT_LIMIT_S, f"{exited - done_at:.1f} s from done: to exit"


# Imported at start-up from PYTHONPATH: a module global whose finaliser writes a line when the
# interpreter tears its modules down (os.write bound early: the os module may be gone by then).
TEARDOWN_PROBE = ("import os\n"
                  "class _Teardown:\n"
                  "  def __del__(self, write=os.write):\n"
                  "    write(2, b'interpreter teardown\\n')\n"
                  "_probe = _Teardown()\n")


@pytest.mark.needs_gymnax
def test_a_finished_device_run_or_sweep_skips_the_interpreters_teardown(tmp_path):
  """A device run's, its evaluation's and a sweep's commands end once their output is written,
  without the interpreter's teardown (most of a second of garbage collection over the heap a run
  leaves); bad input ends the usual way (the probe sees that teardown, so it would see the others)."""
  probe = tmp_path / "probe"
  probe.mkdir()
  (probe / "sitecustomize.py").write_text(TEARDOWN_PROBE)
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(probe), ROOT]))
  run = lambda *argv: subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, env=env, capture_output=True,
                                     text=True, timeout=600)
  flags = ["--agent", "ppo", "--env", "gymnax:CartPole-v1", "--backend", "device", "--steps", "1024"]
  bad = run("launch.train", *flags, "--eval_every", "0")
  assert bad.returncode == 2 and "interpreter teardown" in bad.stderr, bad.stderr[-2000:]
  done = run("launch.train", *flags, "--run_dir", str(tmp_path / "run"))
  assert done.returncode == 0 and "interpreter teardown" not in done.stderr, done.stderr[-2000:]
  assert json.loads((tmp_path / "run" / "summary.json").read_text())["actor_steps"] == 1024
  evaluated = run("launch.evaluate", str(tmp_path / "run"))
  assert evaluated.returncode == 0 and "interpreter teardown" not in evaluated.stderr, evaluated.stderr[-2000:]
  assert "best policy of" in evaluated.stdout and "return " in evaluated.stdout, evaluated.stdout
  swept = run("launch.sweep", *flags, "--seeds", "0-1", "--run_dir", str(tmp_path / "sweep"))
  assert swept.returncode == 0 and "interpreter teardown" not in swept.stderr, swept.stderr[-2000:]
  assert json.loads((tmp_path / "sweep" / "sweep.json").read_text())["runs"][1]["status"] == "ok"
  assert (tmp_path / "sweep" / "report.md").exists()
