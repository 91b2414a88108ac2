"""bench/accelerator_check.py --quick: the accelerator check's arms, small, on this machine, as a
person with a GPU would run the full one (`python -m bench.accelerator_check`). Two checks, a group
each: the device loop's arms, and embedded DQN's with the distributed arm (on this CPU host the arms
that need an accelerator are recorded as skipped, and the CPU's run)."""

import json
import os
import subprocess
import sys

import pytest

from bench import accelerator_check

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _check(tmp_path, only):
  out = tmp_path / "check"
  done = subprocess.run([sys.executable, "-m", "bench.accelerator_check", "--quick", "--out", str(out), "--only", only],
                        cwd=ROOT, capture_output=True, text=True, timeout=2700)  # the quick budget's guard, and more
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  return json.loads((out / "results.json").read_text()), (out / "table.md").read_text()


@pytest.mark.needs_gymnax
@pytest.mark.slow  # five arms, each a process of its own: about a minute and a half on two cores
def test_the_quick_accelerator_check_runs_every_device_arm_and_writes_its_table(tmp_path):
  record, table = _check(tmp_path, "device")
  assert record["quick"] and record["devices"]["platform"] == "cpu"
  assert list(record["arms"]) == ["vmapped", "purejaxrl", "wide_jrl", "wide_purejaxrl", "one_by_one"]
  assert all(arm["ok"] and arm["wall_seconds"] > 0 for arm in record["arms"].values()), record["arms"]
  vmapped, one_by_one = record["arms"]["vmapped"], record["arms"]["one_by_one"]
  # Both sweeps trained the same two seeds: their runs' digests differ by seed, not by arm's count.
  assert [s["seed"] for s in vmapped["seeds"]] == [s["seed"] for s in one_by_one["seeds"]] == [0, 1]
  assert all(set(s["phase_seconds"]) == {"device_loop", "eval", "compile", "other"} for s in vmapped["seeds"])
  # The process's compile and loop: the vmapped sweep's are its runs' shared ones; one by one, their sum.
  assert vmapped["compile_seconds"] == round(vmapped["seeds"][0]["phase_seconds"]["compile"], 1)
  assert one_by_one["loop_seconds"] == round(sum(s["phase_seconds"]["device_loop"] for s in one_by_one["seeds"]), 1)
  assert f"compile {vmapped['compile_seconds']} s, loop {vmapped['loop_seconds']} s; host" in table
  assert record["arms"]["wide_jrl"]["env_steps"] >= record["sizes"]["wide_steps"]
  assert len(record["arms"]["purejaxrl"]["training_return_finals"]) == 2
  figures = record["figures"]
  wall = lambda name: record["arms"][name]["wall_seconds"]
  assert figures["vmapped_over_purejaxrl"] == pytest.approx(wall("vmapped") / wall("purejaxrl"), abs=1e-3)
  assert figures["vmapped_over_one_by_one"] == pytest.approx(wall("vmapped") / wall("one_by_one"), abs=1e-3)
  assert figures["host_vmapped_over_single"] > 0 and figures["wide_jrl_over_purejaxrl_process_rate"] > 0
  assert table.startswith("Accelerator check (quick)") and "| vmapped |" in table and "| one_by_one |" in table
  assert "| vmapped_over_purejaxrl |" in table


@pytest.mark.slow  # four embedded DQN runs on the CPU (Atari's Nature CNN at batch 256 the longest): about 1.5 min
def test_the_quick_check_runs_embedded_dqn_on_the_cpu_and_skips_what_needs_an_accelerator(tmp_path):
  record, table = _check(tmp_path, "embedded,distributed")
  assert record["devices"]["platform"] == "cpu"
  names = [f"dqn_{game}_b{batch}_{placement}" for game in ("minatar", "atari") for batch in (32, 256)
           for placement in ("cpu", "acc_actor_cpu", "acc_actor_acc")]
  assert list(record["arms"]) == names + ["distributed_dqn"]
  for name, arm in record["arms"].items():
    if name.endswith("_cpu") and "_acc_" not in name:  # everything on the CPU: it ran
      assert arm["ok"] is True and not arm.get("skipped"), (name, arm)
      assert arm["env_steps"] >= record["sizes"]["embedded_steps"][name.split("_")[1]]
      assert arm["env_steps_per_second"] > 0 and arm["updates_per_second"] > 0
      assert arm["devices"] == {"learner": ["cpu:0"], "actor": ["cpu:0"], "evaluator": ["cpu:0"]}
      assert arm["config"]["batch_size"] == int(name.split("_")[2][1:])
      assert f"| {name} | cpu:0 | cpu:0 |" in table
    else:  # the learner on the accelerator, or the distributed program (launchpad and a GPU): skipped
      assert arm["ok"] is None and arm["skipped"].startswith("no accelerator"), (name, arm)
      assert f"| {name} | - | skipped: no accelerator" in table
  # MinAtar's runs learn long enough for steady rates: one update per 4 env steps, as the preset.
  for batch in (32, 256):
    arm = record["arms"][f"dqn_minatar_b{batch}_cpu"]
    assert arm["steady_updates_per_second"] == pytest.approx(arm["steady_env_steps_per_second"] / 4, rel=0.05)
  assert "The distributed DQN arm (8 actors, the inference server) was skipped: no accelerator" in table
  assert "are not built yet" not in table


def test_only_takes_arms_and_groups_and_refuses_an_unknown_name(tmp_path):
  groups = accelerator_check.GROUPS
  assert len(groups["embedded"]) == 12 and groups["distributed"] == ("distributed_dqn",)
  with pytest.raises(SystemExit):  # before anything runs
    accelerator_check.main(["--quick", "--out", str(tmp_path), "--only", "embedded,gpu_arm"])


def test_a_sweeps_compile_and_loop_are_the_processs():
  """A vmapped sweep's runs each report the sweep's one compile and loop; runs one by one their own."""
  seeds = [{"phase_seconds": {"compile": 9.04, "device_loop": 7.12, "eval": 0.0, "other": 0.3}},
           {"phase_seconds": {"compile": 0.96, "device_loop": 6.88, "eval": 0.0, "other": 0.2}}]
  assert accelerator_check.process_phases(seeds, vmapped=True) == {"compile_seconds": 9.0, "loop_seconds": 7.1}
  assert accelerator_check.process_phases(seeds, vmapped=False) == {"compile_seconds": 10.0, "loop_seconds": 14.0}


def test_an_accelerator_hosts_arms_are_set_beside_the_cpus():
  """What a GPU host's record becomes (this host has none): the rates, the devices, the figures over
  the CPU's run, an arm stopped at its limit with its steady rates, the distributed arm's row."""
  embedded = lambda learner, actor, sps, ups: {
      "wall_seconds": 30.0, "ok": True, "timed_out": False, "env_steps": 30_000, "env_steps_per_second": sps * 0.9,
      "updates_per_second": ups * 0.9, "steady_env_steps_per_second": sps, "steady_updates_per_second": ups,
      "devices": {"learner": [learner], "actor": [actor], "evaluator": [learner]}}
  arms = {"dqn_minatar_b32_cpu": embedded("cpu:0", "cpu:0", 1000.0, 250.0),
          "dqn_minatar_b32_acc_actor_cpu": embedded("cuda:0", "cpu:0", 2000.0, 500.0),
          "dqn_minatar_b32_acc_actor_acc": embedded("cuda:0", "cuda:0", 1500.0, 375.0),
          "dqn_atari_b256_cpu": {"wall_seconds": 38.4, "ok": False, "timed_out": True,
                                 "steady_env_steps_per_second": 4.0, "steady_updates_per_second": 1.0},
          "distributed_dqn": {"wall_seconds": 90.0, "ok": True, "timed_out": False, "env_steps": 100_000,
                              "env_steps_per_second": 4000.0, "run_env_steps_per_second": 3500.0,
                              "updates_per_second": 900.0, "inference_batch_mean": 7.5,
                              "devices": {"learner": ["cuda:0"], "inference": ["cuda:0"], "actor": ["cpu"] * 8}}}
  record = {"date": "2026-12-05", "quick": False, "arms": arms, "sizes": {"seeds": 16, "steps": 500_000},
            "devices": {"platform": "gpu", "kind": "NVIDIA H100", "count": 1, "jax": "0.6.2"}}
  record["figures"] = accelerator_check.summarise(record)
  assert record["figures"] == {"dqn_minatar_b32_acc_actor_cpu_over_cpu_env_steps": 2.0,
                               "dqn_minatar_b32_acc_actor_cpu_over_cpu_updates": 2.0,
                               "dqn_minatar_b32_acc_actor_acc_over_cpu_env_steps": 1.5,
                               "dqn_minatar_b32_acc_actor_acc_over_cpu_updates": 1.5}
  table = accelerator_check.table(record)
  assert "| dqn_minatar_b32_acc_actor_cpu | cuda:0 | cpu:0 | 1,800 | 450 | 2,000 | 500 |" in table
  assert "| dqn_atari_b256_cpu | 38.4 | stopped at its time limit (steady: 4.0 env steps/s, 1.0 updates/s) |" in table
  assert ("| distributed_dqn | 90.0 | 100000 env steps: 4,000 env steps/s, 900 updates/s, inference batch mean 7.5; "
          "learner cuda:0, inference cuda:0 |") in table
  assert "| dqn_minatar_b32_acc_actor_acc_over_cpu_env_steps | 1.5 |" in table
  assert "distributed DQN arm" not in table  # it ran
