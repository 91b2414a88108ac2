"""Ctrl-C (SIGINT) and SIGTERM: a run stops at its next safe point, writes a checkpoint of itself
there and exits 130 (SIGINT) or 143 (SIGTERM) naming it; --resume then ends with the same bytes
as a run never stopped. Real `launch.train` processes, real signals."""

import csv
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from jrl.experiment.checkpoint import Checkpointer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EMBEDDED = ["--seed", "3", "--steps", "6000", "--deterministic", "--eval_every", "1000", "--eval_episodes", "3",
            "--min_replay_size", "500", "--hidden_sizes", "32,32", "--log_every", "500", "--progress_seconds", "0"]
# The first chunk is 1/64 of the run and the next at most 8 times that (ChunkSizer): the signal,
# sent once the first chunk's rows are written, stops the run at the end of its second chunk, at
# most 9/64 of the budget, whatever the machine's speed.
DEVICE = ["--backend", "device", "--agent", "ppo", "--env", "gymnax:CartPole-v1", "--seed", "3", "--steps", "150000",
          "--progress_seconds", "0"]


def _train(args, timeout=600):
  done = subprocess.run([sys.executable, "-m", "launch.train", *args], cwd=ROOT, text=True, capture_output=True,
                        timeout=timeout)
  assert done.returncode == 0, done.stderr[-3000:]
  return done


def _summary(run_dir):
  with open(os.path.join(run_dir, "summary.json")) as f:
    return json.load(f)


def _metric_rows(run_dir):
  try:
    with open(os.path.join(run_dir, "metrics", "actor.csv")) as f:
      return list(csv.DictReader(f))
  except FileNotFoundError:
    return []


def _interrupt_after_first_row(args, run_dir, sig, timeout=300.0):
  """Starts the run, sends `sig` once its first metric row is written; (status, stderr)."""
  proc = subprocess.Popen([sys.executable, "-m", "launch.train", *args, "--run_dir", run_dir], cwd=ROOT, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  deadline = time.monotonic() + timeout
  while not _metric_rows(run_dir):
    assert proc.poll() is None, f"the run ended before its first row: {proc.communicate()[1][-3000:]}"
    assert time.monotonic() < deadline, "no metric row in time"
    time.sleep(0.01)
  proc.send_signal(sig)
  _, err = proc.communicate(timeout=120)
  return proc.returncode, err


def _check_interrupted_and_resumed(run_dir, sig, status, err, budget, reference):
  """The interrupted run exited 128 + sig naming the checkpoint it wrote as it stopped (short of
  the budget; nothing else checkpointed it: the default is every 600 s), and its resume ends
  with the uninterrupted run's parameters."""
  name = signal.Signals(sig).name
  assert status == 128 + sig, err[-3000:]
  assert not os.path.exists(os.path.join(run_dir, "summary.json"))
  checkpoints = Checkpointer(run_dir).all()
  assert len(checkpoints) == 1, checkpoints
  steps = Checkpointer(run_dir).verify(checkpoints[0]).manifest["counters"]["actor_steps"]
  assert 0 < steps < budget
  line = err.strip().splitlines()[-1]
  assert line == (f"python -m launch.train: interrupted ({name}); checkpoint written at {steps:.0f} env steps "
                  f"(checkpoints/{os.path.basename(checkpoints[0])}); continue with: python -m launch.train "
                  f"--resume {run_dir}"), err[-3000:]
  _train(["--resume", run_dir])
  resumed = _summary(run_dir)
  assert resumed["resumed"] and resumed["actor_steps"] == reference["actor_steps"]
  assert resumed["params_digest"] == reference["params_digest"]


@pytest.mark.slow
def test_embedded_run_interrupted_by_sigint_or_sigterm_checkpoints_and_resumes_to_the_same_bytes(tmp_path):
  _train([*EMBEDDED, "--run_dir", str(tmp_path / "whole")])
  reference = _summary(tmp_path / "whole")
  for sig in (signal.SIGINT, signal.SIGTERM):
    run_dir = str(tmp_path / signal.Signals(sig).name)
    status, err = _interrupt_after_first_row(EMBEDDED, run_dir, sig)
    _check_interrupted_and_resumed(run_dir, sig, status, err, 6000, reference)


@pytest.mark.slow
@pytest.mark.needs_gymnax
def test_device_run_interrupted_by_sigint_checkpoints_and_resumes_to_the_same_bytes(tmp_path):
  _train([*DEVICE, "--run_dir", str(tmp_path / "whole")])
  reference = _summary(tmp_path / "whole")
  run_dir = str(tmp_path / "interrupted")
  status, err = _interrupt_after_first_row(DEVICE, run_dir, signal.SIGINT)
  _check_interrupted_and_resumed(run_dir, signal.SIGINT, status, err, 150_000, reference)


@pytest.mark.slow
@pytest.mark.needs_reverb
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_a_stopped_distributed_program_has_its_learner_checkpoint_first_and_resume_continues(tmp_path, sig):
  """SIGTERM (a scheduler's) or SIGINT (Ctrl-C) to the launcher of a real local_mp program: the
  learner writes a checkpoint (learner, counters, replay) before the nodes are stopped, the
  launcher exits 128 + the signal naming it, and --resume continues from it."""
  from test_fault_tolerance import SMALL, Program
  program = Program(tmp_path / "run", [*SMALL, "--steps", "100000", "--num_actors", "1"])
  try:
    program.wait_for(lambda: len(program.metric_rows("actor0")) >= 2, 240, "actor rows")
    assert Checkpointer(program.run_dir).all() == []  # the periodic checkpoint is 600 s away
    program.proc.send_signal(sig)
    program.proc.wait(120)
  finally:
    status = program.finish(timeout=0)
  assert status == 128 + sig, program.output()
  assert program.processes() == []
  assert not os.path.exists(program.path("summary.json"))
  checkpoints = Checkpointer(program.run_dir).all()
  assert len(checkpoints) == 1, program.output()
  saved = Checkpointer(program.run_dir).verify(checkpoints[0]).manifest["counters"]
  assert saved["actor_steps"] > 0 and saved["learner_steps"] > 0
  assert f"checkpoint {os.path.basename(checkpoints[0])}:" in program.log("learner/0")
  assert (f"python -m launch.train: interrupted ({signal.Signals(sig).name}); the last checkpoint is "
          f"{checkpoints[0]} ({saved['actor_steps']:.0f} env steps); continue with: python -m launch.train --resume "
          f"{program.run_dir}") in program.stderr, program.output()
  if sig == signal.SIGINT:
    return  # one resume is enough
  budget = int(saved["actor_steps"]) + 1_000
  resumed = subprocess.run([sys.executable, "-m", "launch.train", "--resume", program.run_dir, "--steps", str(budget)],
                           cwd=ROOT, text=True, capture_output=True, timeout=600)
  assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
  summary = _summary(program.run_dir)
  assert summary["resumed"] and summary["actor_steps"] >= budget


@pytest.mark.slow
@pytest.mark.needs_gymnax
def test_vmapped_sweep_interrupted_checkpoints_every_run_and_the_same_command_continues_them(tmp_path):
  """launch.sweep --backend device (one vmapped program of two seeds) at Ctrl-C: every run
  checkpoints at the same env steps, the sweep exits 130 saying so, and the same command again
  continues them to the uninterrupted sweep's parameters."""
  sweep = [sys.executable, "-m", "launch.sweep", "--agent", "ppo", "--env", "gymnax:CartPole-v1", "--backend",
           "device", "--seeds", "0-1", "--steps", "150000", "--progress_seconds", "0", "--run_dir"]
  whole = subprocess.run([*sweep, str(tmp_path / "whole")], cwd=ROOT, text=True, capture_output=True, timeout=600)
  assert whole.returncode == 0, whole.stderr[-3000:]
  sweep_dir = tmp_path / "interrupted"
  proc = subprocess.Popen([*sweep, str(sweep_dir)], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE)
  deadline = time.monotonic() + 300
  while not any(_metric_rows(os.path.dirname(os.path.dirname(p))) for p in sweep_dir.glob("*/metrics/actor.csv")):
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    assert time.monotonic() < deadline, "no metric row in time"
    time.sleep(0.01)
  proc.send_signal(signal.SIGINT)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 130, err[-3000:]
  runs = sorted(p.name for p in (tmp_path / "whole").iterdir() if (p / "summary.json").exists())
  assert len(runs) == 2
  steps = set()
  for name in runs:
    run_dir = str(sweep_dir / name)
    assert not os.path.exists(os.path.join(run_dir, "summary.json"))
    checkpoints = Checkpointer(run_dir).all()
    assert len(checkpoints) == 1, checkpoints
    steps.add(Checkpointer(run_dir).verify(checkpoints[0]).manifest["counters"]["actor_steps"])
  assert len(steps) == 1 and 0 < min(steps) < 150_000
  assert f"every unfinished run checkpointed at {min(steps):.0f} env steps; the same command continues them" in err
  again = subprocess.run([*sweep, str(sweep_dir)], cwd=ROOT, text=True, capture_output=True, timeout=600)
  assert again.returncode == 0, again.stderr[-3000:]
  for name in runs:
    continued, reference = _summary(sweep_dir / name), _summary(tmp_path / "whole" / name)
    assert continued["resumed"] and continued["params_digest"] == reference["params_digest"]
