"""bench/accelerator_check.py --quick: the accelerator check's arms, small, on this machine, as a
person with a GPU would run the full one (`python -m bench.accelerator_check`)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.needs_gymnax


@pytest.mark.slow  # five arms, each a process of its own: about a minute and a half on two cores
def test_the_quick_accelerator_check_runs_every_arm_and_writes_its_table(tmp_path):
  out = tmp_path / "check"
  done = subprocess.run([sys.executable, "-m", "bench.accelerator_check", "--quick", "--out", str(out)], cwd=ROOT,
                        capture_output=True, text=True, timeout=900)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  record = json.loads((out / "results.json").read_text())
  assert record["quick"] and record["devices"]["platform"] == "cpu"
  assert list(record["arms"]) == ["vmapped", "purejaxrl", "wide_jrl", "wide_purejaxrl", "one_by_one"]
  assert all(arm["ok"] and arm["wall_seconds"] > 0 for arm in record["arms"].values()), record["arms"]
  vmapped, one_by_one = record["arms"]["vmapped"], record["arms"]["one_by_one"]
  # Both sweeps trained the same two seeds: their runs' digests differ by seed, not by arm's count.
  assert [s["seed"] for s in vmapped["seeds"]] == [s["seed"] for s in one_by_one["seeds"]] == [0, 1]
  assert all(set(s["phase_seconds"]) == {"device_loop", "eval", "compile", "other"} for s in vmapped["seeds"])
  assert record["arms"]["wide_jrl"]["env_steps"] >= record["sizes"]["wide_steps"]
  assert len(record["arms"]["purejaxrl"]["training_return_finals"]) == 2
  figures = record["figures"]
  wall = lambda name: record["arms"][name]["wall_seconds"]
  assert figures["vmapped_over_purejaxrl"] == pytest.approx(wall("vmapped") / wall("purejaxrl"), abs=1e-3)
  assert figures["vmapped_over_one_by_one"] == pytest.approx(wall("vmapped") / wall("one_by_one"), abs=1e-3)
  assert figures["host_vmapped_over_single"] > 0 and figures["wide_jrl_over_purejaxrl_process_rate"] > 0
  table = (out / "table.md").read_text()
  assert table.startswith("Accelerator check (quick)") and "| vmapped |" in table and "| one_by_one |" in table
  assert "| vmapped_over_purejaxrl |" in table
