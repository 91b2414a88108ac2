"""Many seeds of a device run in one vmapped program (`jrl.run.device.sweep`, `launch.sweep
--backend device`): where its seeds start and how far they drift from single runs, the run
folders and report it writes, resume, and bad input."""

import dataclasses
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jrl.agents import dqn, ppo
from jrl.experiment.config import ExperimentConfig

pytestmark = pytest.mark.needs_gymnax
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL_DQN = dqn.Config(hidden_sizes=(32, 32), min_replay_size=200)


def _leaves(tree):
  return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


@pytest.mark.slow  # compiles the chunk twice (vmapped and alone): about a minute
def test_seed_k_of_a_vmapped_sweep_starts_as_run_k_and_differs_by_float_error_after_a_chunk():
  """Seed k's carry is the single run's bytes at the start (init is vmapped over traced seeds);
  after one chunk of PPO updates its parameters differ from the single run's by float
  reduction order only (XLA fuses the batched program differently), far below a learning step."""
  from jrl.run.device.loop import DeviceLoop, EvalBooks, build_device_parts, make_plan
  from jrl.run.device.runner import calls_due_in_chunk, schedule_chunk
  from jrl.gymnax_envs import GymnaxVecEnv
  from jrl.learners import sharding
  cfg = ppo.Config(hidden_sizes=(32, 32))
  exp = ExperimentConfig(agent="ppo", env="gymnax:CartPole-v1", backend="device", steps=4096)
  env = GymnaxVecEnv(exp.env)
  parts = build_device_parts("ppo", env, cfg)
  plan = make_plan(exp, parts, cfg, 1)
  loop = DeviceLoop(exp, cfg, env, parts, sharding.make_mesh(1), plan)
  seeds = [3, 7]
  together = jax.jit(jax.vmap(loop.init))(jnp.asarray(seeds, jnp.int32))
  inputs = schedule_chunk(plan, lambda v, n: calls_due_in_chunk(plan, loop, v, n), 0, 0, exp.steps, exp.log_every,
                          exp.log_every, exp.eval_every, exp.eval_every, None).inputs
  books = EvalBooks(jax.random.PRNGKey(0), jnp.int32(0), jnp.float32(0), jnp.float32(jnp.inf))
  open_row = {k: jnp.zeros((), dtype) for k, dtype in loop.stat_dtypes().items()}
  after_together, _ = jax.jit(jax.vmap(loop.chunk, in_axes=(0, None, None, None)))(together, inputs, books, open_row)
  for k, seed in enumerate(seeds):
    alone = jax.jit(loop.init, static_argnums=0)(seed)
    for a, b in zip(_leaves(alone), _leaves(together)):
      assert np.array_equal(a, b[k])
    after_alone, _ = jax.jit(loop.chunk)(alone, inputs, books, open_row)
    start = _leaves(loop.learner.params(alone.learner_state))
    moved = _leaves(loop.learner.params(after_alone.learner_state))
    drift = _leaves(loop.learner.params(after_together.learner_state))
    step = max(float(np.max(np.abs(m - s))) for m, s in zip(moved, start))
    diff = max(float(np.max(np.abs(m - d[k]))) for m, d in zip(moved, drift))
    assert step > 1e-3 and diff < 1e-5, (step, diff)


@pytest.mark.slow  # three sweeps
def test_a_vmapped_sweep_resumed_from_its_checkpoints_ends_with_the_same_bytes(tmp_path):
  """Two DQN seeds in one program, stopped at half the budget and resumed, end with the
  parameters of the sweep never stopped; each seed's folder is a device run of its own."""
  from jrl.run.device.sweep import run_device_sweep
  exp = ExperimentConfig(agent="dqn", env="gymnax:CartPole-v1", backend="device", steps=2000, eval_every=1000,
                         num_envs=4, progress_seconds=0, eval_episodes=2)
  dirs = lambda name: [str(tmp_path / name / f"s{seed}") for seed in (0, 1)]
  straight = run_device_sweep(exp, SMALL_DQN, [0, 1], dirs("straight"))
  run_device_sweep(dataclasses.replace(exp, steps=1000), SMALL_DQN, [0, 1], dirs("resumed"))
  resumed = run_device_sweep(dataclasses.replace(exp, resume="yes"), SMALL_DQN, [0, 1], dirs("resumed"))
  assert [s["params_digest"] for s in resumed] == [s["params_digest"] for s in straight]
  assert straight[0]["params_digest"] != straight[1]["params_digest"]
  assert all(s["resumed"] and s["actor_steps"] == 2000 and s["kind"] == "device" for s in resumed), resumed
  assert resumed[1]["details"]["vmapped_runs"] == 2 and resumed[1]["details"]["grid_point"] == {}
  # Chunks of a fixed length (bench/device_host_share.py's same-syncs arms): 2,000 steps in chunks of
  # 500 are 4 host syncs, and where chunks end changes no bytes.
  fixed = run_device_sweep(exp, SMALL_DQN, [0, 1], dirs("fixed"), chunk_steps=500)
  assert [s["params_digest"] for s in fixed] == [s["params_digest"] for s in straight]
  assert [s["details"]["host_syncs"] for s in fixed] == [4, 4]
  for run_dir in dirs("straight"):
    assert {"config.json", "summary.json", "report.md", "metrics", "policies", "checkpoints",
            "tensorboard", "plots"} <= set(os.listdir(run_dir))
    with open(os.path.join(run_dir, "config.json")) as f:
      assert json.load(f)["experiment"]["seed"] == int(run_dir[-1])


@pytest.mark.parametrize("flags, field", [
    (["--parallel", "2"], "parallel"),
    (["--launcher", "slurm", "--hosts", "node1,node2"], "launcher"),  # processes over hosts: one run at a time
])
def test_a_vmapped_sweep_outside_one_process_is_refused_in_one_line(tmp_path, flags, field):
  run_dir = tmp_path / "sweep"
  done = subprocess.run([sys.executable, "-m", "launch.sweep", "--agent", "ppo", "--env", "gymnax:CartPole-v1",
                         "--backend", "device", "--seeds", "0-1", *flags, "--run_dir", str(run_dir)],
                        cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert done.returncode == 2, done.stderr
  lines = done.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(f"python -m launch.sweep: error: {field}: ") and \
      "--one_by_one" in lines[0], done.stderr
  assert not run_dir.exists()


@pytest.mark.slow  # a launch.sweep command: compiles the vmapped loop
def test_launch_sweep_with_the_device_backend_runs_every_seed_in_one_program_and_reports(tmp_path):
  run_dir = tmp_path / "sweep"
  done = subprocess.run([sys.executable, "-m", "launch.sweep", "--agent", "dqn", "--env", "gymnax:CartPole-v1",
                         "--backend", "device", "--seeds", "0-2", "--steps", "2000", "--eval_every", "1000",
                         "--num_envs", "4", "--hidden_sizes", "32,32", "--min_replay_size", "200",
                         "--run_dir", str(run_dir)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                        env=dict(os.environ, JRL_JAX_CACHE=str(tmp_path / "jax-cache")))  # every program compiled
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  assert "all in one vmapped program" in done.stdout
  with open(run_dir / "sweep.json") as f:
    record = json.load(f)
  assert [r["status"] for r in record["runs"]] == ["ok"] * 3
  digests, summaries = set(), []
  for run in record["runs"]:
    with open(run_dir / run["run_dir"] / "summary.json") as f:
      summary = json.load(f)
    assert summary["seed"] == run["seed"] and summary["details"]["vmapped_runs"] == 3
    assert summary["actor_steps"] == 2000 and summary["evaluations"] == 2
    digests.add(summary["params_digest"])
    summaries.append(summary)
  assert len(digests) == 3
  # Every run's evaluations ran inside the one program (the host made none), and its report says so.
  for summary, run in zip(summaries, record["runs"]):
    phases = summary["phase_seconds"]["main"]
    assert summary["details"]["device_evaluations"] == 2 and phases["eval"] == 0.0, (summary["details"], phases)
    assert summary["details"]["loop_compiles"] == 0, summary["details"]  # not even the params at the end
    text = (run_dir / run["run_dir"] / "report.md").read_text()
    assert "## vmapped sweep" in text and "2 of this session's evaluations ran inside the compiled loop" in text
  # One progress line for the sweep, not one per run: every line names the three runs.
  lines = [line for line in done.stdout.splitlines() if "steps " in line and "/2000" in line]
  assert lines and all(line.startswith("[dqn gymnax:CartPole-v1 3 runs]") for line in lines), done.stdout[-3000:]
  report = (run_dir / "report.md").read_text()
  assert "3 runs" in report or "| 3 |" in report, report[:2000]


@pytest.mark.parametrize("flags, field", [
    (["--grid", "hidden_sizes=64"], "hidden_sizes"),
    (["--grid", "no_such_field=1,2"], "no_such_field"),
    (["--grid", "n_step=1,3"], "n_step"),
    (["--grid", "learning_rate=1e-3", "--one_by_one"], "--backend device"),
])
def test_a_grid_field_the_program_cannot_trace_is_refused_in_one_line(flags, field, tmp_path):
  """Shape fields (hidden_sizes, n_step: the replay layout), unknown fields, and a grid outside one
  vmapped program: one line naming the field, exit 2, nothing written."""
  run_dir = tmp_path / "sweep"
  done = subprocess.run([sys.executable, "-m", "launch.sweep", "--agent", "dqn", "--env", "gymnax:CartPole-v1",
                         "--backend", "device", "--seeds", "0-1", "--run_dir", str(run_dir), *flags],
                        cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
  lines = done.stderr.strip().splitlines()
  assert len(lines) == 1 and "grid" in lines[0] and field in lines[0], done.stderr
  assert not run_dir.exists()


@pytest.mark.slow  # a launch.sweep command of 12 runs in one program
def test_a_grid_of_three_learning_rates_by_four_seeds_writes_twelve_runs_and_compares_the_points(tmp_path):
  run_dir = tmp_path / "grid"
  rates = ["0.003", "0.001", "0.0003"]
  done = subprocess.run([sys.executable, "-m", "launch.sweep", "--agent", "dqn", "--env", "gymnax:CartPole-v1",
                         "--backend", "device", "--seeds", "0-3", "--grid", "learning_rate=" + ",".join(rates),
                         "--steps", "2000", "--eval_every", "1000", "--num_envs", "4", "--hidden_sizes", "32,32",
                         "--min_replay_size", "200", "--reps", "2000", "--run_dir", str(run_dir)],
                        cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  runs = sorted(p for p in os.listdir(run_dir) if (run_dir / p / "summary.json").is_file())
  assert len(runs) == 12, runs
  rates_seen = set()
  for name in runs:
    with open(run_dir / name / "config.json") as f:
      config = json.load(f)
    with open(run_dir / name / "summary.json") as f:
      summary = json.load(f)
    lr = config["agent"]["learning_rate"]
    assert summary["details"]["grid_point"] == {"learning_rate": lr} and f"learning_rate_{lr:g}" in name
    rates_seen.add(lr)
  assert rates_seen == {float(r) for r in rates}
  with open(run_dir / "report.json") as f:
    report = json.load(f)
  groups = {g["agent"]: g for g in report["groups"]}
  assert set(groups) == {f"dqn learning_rate={float(r):g}" for r in rates}, set(groups)
  for group in groups.values():
    iqm = group["iqm"]
    assert len(group["scores"]) == 4 and iqm["low"] <= iqm["point"] <= iqm["high"], group
