"""Run directories written by the code at 18d3c4a (before the distributed program moved onto
the run core and configs were grouped), one per backend, resume with today's code: as a user
types it (`launch.train --resume DIR --steps N`, a relative path), to the budget, with their
books continued; the embedded and device runs to the bytes the code that wrote them ends with
when it resumes them here (`resumed_by_writer`: XLA's CPU kernels round differently on another
processor, so no digest is recorded)."""

import json
import os
import shutil
import subprocess
import sys

import jax
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OLD_RUNS = os.path.join(ROOT, "tests", "data", "at_18d3c4a")
WRITER = "18d3c4a"  # the commit that wrote them, with JAX OLD_RUNS_JAX
OLD_RUNS_JAX = "0.6.2"


def resume_as_typed(tmp_path, name: str, steps: int) -> dict:
  """Copies OLD_RUNS/NAME to ./runs/NAME of a fresh folder and resumes it from there to `steps`."""
  shutil.copytree(os.path.join(OLD_RUNS, name), tmp_path / "runs" / name)
  out = subprocess.run([sys.executable, "-m", "launch.train", "--resume", f"runs/{name}", "--steps", str(steps),
                        "--progress_seconds", "0"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": ROOT})
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
  with open(tmp_path / "runs" / name / "summary.json") as f:
    return json.load(f)


def old_summary(name: str) -> dict:
  with open(os.path.join(OLD_RUNS, name, "summary.json")) as f:
    return json.load(f)


@pytest.mark.slow
@pytest.mark.parametrize("name, steps", [pytest.param("dqn", 3072),
                                         pytest.param("device-ppo", 6144, marks=pytest.mark.needs_gymnax)])
def test_an_embedded_or_device_run_written_at_18d3c4a_resumes_to_the_writers_bytes(name, steps, tmp_path,
                                                                                   resumed_by_writer):
  before = old_summary(name)
  summary = resume_as_typed(tmp_path, name, steps)
  assert summary["resumed"] and summary["actor_steps"] == steps > before["actor_steps"]
  assert summary["evaluations"] > before["evaluations"]  # the history continued, not restarted
  if jax.__version__ == OLD_RUNS_JAX:  # another JAX computes other last bits
    writers = resumed_by_writer(WRITER, os.path.join(OLD_RUNS, name), steps)
    assert (summary["learner_steps"], summary["params_digest"]) == (writers["learner_steps"], writers["params_digest"])


@pytest.mark.slow
@pytest.mark.needs_reverb
def test_a_distributed_run_written_at_18d3c4a_resumes_to_its_budget(tmp_path):
  """Its learner checkpoint, Reverb tables and the evaluation history kept in its counter."""
  before = old_summary("distributed-dqn")
  summary = resume_as_typed(tmp_path, "distributed-dqn", 3072)
  assert summary["resumed"] and summary["actor_steps"] >= 3072
  assert summary["learner_steps"] > before["learner_steps"]
  assert summary["evaluations"] > before["evaluations"]
