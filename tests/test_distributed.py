"""Real Launchpad programs (local_mp: one process per node, real Reverb and courier)."""

import csv
import glob
import json
import os
import re
import subprocess
import sys
import time

import psutil
import pytest

pytestmark = [pytest.mark.needs_reverb, pytest.mark.slow]  # real Launchpad programs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ["--steps", "3000", "--min_replay_size", "500", "--eval_every", "1000", "--eval_episodes", "3",
         "--hidden_sizes", "32,32", "--num_envs", "4", "--progress_seconds", "1"]


def _node_processes(since: float):
  found = []
  for proc in psutil.process_iter(["cmdline", "create_time"]):
    cmdline = " ".join(proc.info["cmdline"] or [])
    if "launchpad.nodes.python.process_entry" in cmdline and proc.info["create_time"] >= since - 1:
      found.append(proc)
  return found


def _train(args, timeout=420):
  start = time.time()
  out = subprocess.run([sys.executable, "-m", "launch.train", "--distributed", *args], cwd=ROOT, text=True,
                       capture_output=True, timeout=timeout)
  time.sleep(1.0)
  return out, _node_processes(start)


def test_program_runs_end_to_end_and_exits_cleanly(tmp_path):
  run_dir = tmp_path / "dist"
  out, leftover = _train([*SMALL, "--num_actors", "2", "--inference", "server", "--run_dir", str(run_dir)])
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  assert leftover == [], leftover
  summary = json.load(open(run_dir / "summary.json"))
  assert summary["kind"] == "distributed" and summary["details"]["inference"] == "server"
  # Two actors report their steps sooner as the budget nears (jrl.run.distributed.counter.report_share): they pass
  # it by less than half of it (a 4,000-step PQN run counted 8,928 when they reported once a second).
  assert 3000 <= summary["actor_steps"] <= 1.5 * 3000 + 2 * 4, summary["actor_steps"]
  details = summary["details"]
  # The summary's learner steps are the learner's as of its final checkpoint (they once lagged by
  # the counter's last second), and the checkpoint's counter agrees with the learner it holds.
  from jrl.experiment.checkpoint import Checkpointer
  final = Checkpointer(str(run_dir)).verify(str(run_dir / "checkpoints" / details["final_checkpoint"]))
  saved = Checkpointer.read_run_state(final)
  assert summary["learner_steps"] >= final.manifest["counters"]["learner_steps"] == saved["learner_steps"] > 0
  assert saved["counter"]["counts"]["learner_steps"] == saved["learner_steps"]
  assert details["replay_items_inserted"] > 0 and details["replay_items_sampled"] > 0
  assert summary["learner_steps"] > 0 and details["learner_version"] > 0
  assert details["inference_batch_mean"] > 1.0  # two actors share server batches
  # Each role's devices (jrl.accelerators): this host has no GPU, so every process ran on the CPU.
  assert details["devices"] == {"counter": ["cpu"], "replay": ["cpu"], "learner": ["cpu"], "inference": ["cpu"],
                                "actor": ["cpu", "cpu"], "evaluator": ["cpu"]}
  assert summary["learner_devices"] == 1  # the learner's mesh, as the learner counts it (LearnerNode.mesh_size)
  # Actors refresh their parameters every variable_update_period steps while the learner goes on:
  # they act with parameters some learner calls old, never newer than the learner's.
  assert 0 < details["policy_lag_mean"] < details["learner_version"], details["policy_lag_mean"]
  # Actors acted with parameters whose version increased over the run.
  for path in sorted(glob.glob(str(run_dir / "metrics" / "actor*.csv"))):
    versions = [float(row["policy_version"]) for row in csv.DictReader(open(path))]
    assert len(versions) >= 2 and versions[-1] > versions[0], (path, versions)
  assert len(glob.glob(str(run_dir / "metrics" / "actor*.csv"))) == 2
  # TensorBoard: each node's rows in its own folder, every row a point (TensorBoard's own reader).
  from test_tensorboard import _scalars
  for role, step_key in (("evaluator", "actor_steps"), ("actor0", "actor_steps"), ("learner", "learner_steps")):
    rows = list(csv.DictReader(open(run_dir / "metrics" / f"{role}.csv")))
    column = "eval_return" if role == "evaluator" else next(k for k in rows[0] if k != step_key)
    points = _scalars(run_dir / "tensorboard" / role)[f"{role}/{column}"]
    assert [step for step, _ in points] == [int(float(row[step_key])) for row in rows], (role, points)
  assert os.path.exists(run_dir / "plots" / "learning_curve.png")
  assert os.path.exists(run_dir / "logs" / "learner" / "0")
  assert "steps " in out.stdout  # progress lines reach the launcher's terminal
  # The launcher starts no JAX backend before it forks its nodes: no JAX os.fork() warning. The
  # progress lines' env steps move from each to the next (start-up printed once), and the closing
  # line rounds the batch mean.
  assert "os.fork()" not in out.stderr, out.stderr[-3000:]
  shown = [int(line.split(" steps ")[1].split("/")[0]) for line in out.stdout.splitlines() if "] steps " in line]
  assert len(shown) >= 2 and all(a < b for a, b in zip(shown, shown[1:])), out.stdout
  assert re.search(r"inference batch mean \d+\.\d\d, policy lag mean", out.stdout), out.stdout[-1000:]
  # The run report: every node's phases, adding up to its wall time; a named bottleneck.
  text = open(run_dir / "report.md").read()
  assert summary["bottleneck"] in ("env", "policy", "inference", "replay", "learner", "params", "other")
  assert f"**bottleneck: {summary['bottleneck']}**" in text and summary["bottleneck_advice"] in text
  assert f"report: {summary['bottleneck_advice']}" in out.stdout
  phases, walls = summary["phase_seconds"], summary["phase_wall_seconds"]
  assert {"learner/0", "learner/0 prefetch", "learner/0 publish", "actor/0", "actor/1", "inference/0",
          "evaluator/0"} <= set(phases), sorted(phases)
  for node, seconds in phases.items():
    assert abs(sum(seconds.values()) - walls[node]) <= 0.05 * walls[node], (node, seconds, walls[node])
  for actor in ("actor/0", "actor/1"):
    assert phases[actor]["env"] > 0 and phases[actor]["inference_wait"] > 0 and phases[actor]["insert"] > 0
  assert phases["inference/0"]["policy"] > 0 and phases["learner/0"]["update"] > 0
  assert summary["rates"]["env_steps_per_second"] > 0 and summary["rates"]["updates_per_second"] > 0
  assert summary["rates"]["samples_per_insert"] > 0
  # Every answered request is in the batch-size histogram: at least one per actor step counted.
  answered = sum(int(k) * v for k, v in details["inference_batch_sizes"].items())
  assert answered >= 3000 / 4
  assert "## inference batch sizes" in text and "## policy lag" in text
  # The learner node starts from the parameters the embedded runner starts from, for the same seed.
  from jrl.agents import dqn
  from jrl.experiment.config import ExperimentConfig
  from jrl.run.embedded import run
  embedded = run(ExperimentConfig(seed=0, steps=600, eval_every=600, eval_episodes=1, progress_seconds=0,
                                  deterministic=True, run_dir=str(tmp_path / "embedded")),
                 dqn.Config(min_replay_size=500, hidden_sizes=(32, 32)))
  learner_log = open(run_dir / "logs" / "learner" / "0").read()
  assert f"initial params_digest {embedded['details']['initial_params_digest']}" in learner_log


def test_a_dying_learner_stops_the_program_with_its_error(tmp_path):
  out, leftover = _train([*SMALL, "--steps", "100000", "--num_actors", "2", "--inference", "actor",
                          "--crash_learner_after", "20", "--run_dir", str(tmp_path / "crash")])
  assert out.returncode != 0
  assert "node learner/0 failed" in out.stderr
  assert "injected learner failure after 20 calls" in out.stderr
  assert leftover == [], leftover
  assert not os.path.exists(tmp_path / "crash" / "summary.json")


def test_a_failed_write_in_a_program_is_in_its_summary(tmp_path):
  """`policies` is a file, not a folder: every policy snapshot fails, the driver node's ('best',
  'final') and the learner node's ('latest', beside each checkpoint). The program trains to its
  end, its summary lists the failed writes, and the launcher exits 1 after the report, naming the
  first in one line."""
  run_dir = tmp_path / "dist"
  run_dir.mkdir()
  (run_dir / "policies").write_text("not a folder\n")
  out, leftover = _train([*SMALL, "--num_actors", "1", "--run_dir", str(run_dir)])
  assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
  assert leftover == [], leftover
  summary = json.load(open(run_dir / "summary.json"))
  assert summary["actor_steps"] >= 3000 and os.path.isfile(run_dir / "report.md")
  # The checkpoints stand (the learner node wrote them); the policy beside each is what they lack.
  assert summary["checkpoints"] and summary["details"]["final_checkpoint"] == summary["checkpoints"][-1]
  failed = summary["failed_writes"]
  assert failed[0].startswith("policy snapshot 'best' was not written ("), failed
  assert failed[-2:] == [line for line in failed[-2:] if "'latest'" in line or "'final'" in line], failed
  assert failed[-1].startswith("policy snapshot 'final' was not written ("), failed
  assert "policy snapshot 'latest' was not written (" in failed[-2], failed
  assert not any(line.startswith("checkpoint was not written") for line in failed), failed
  last = out.stderr.strip().splitlines()[-1]
  assert last == (f"python -m launch.train: error: the run finished and wrote its summary in {run_dir}, but "
                  f"{failed[0]} (and {len(failed) - 1} more failed writes)"), last


def test_distributed_config_errors_are_one_line(tmp_path):
  out = subprocess.run([sys.executable, "-m", "launch.train", "--distributed", "--inference", "remote"],
                       cwd=ROOT, text=True, capture_output=True, timeout=120)
  assert out.returncode == 2
  assert out.stderr.strip() == "python -m launch.train: error: inference: must be 'actor' or 'server', got 'remote'"
