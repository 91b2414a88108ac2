"""End-to-end runs of the embedded runner: artifacts, determinism and learning."""

import csv
import json
import os

import pytest

from jrl.agents import dqn, get_agent
from jrl.experiment.config import ExperimentConfig
from jrl.run.embedded import run

TIME_COLUMNS = ("wall_seconds", "steps_per_second", "updates_per_second")
SHORT = dict(steps=3_000, eval_every=1_000, eval_episodes=3, log_every=500, progress_seconds=0)
SHORT_AGENT = dqn.Config(min_replay_size=500, hidden_sizes=(32, 32))


def _metric_values(run_dir):
  values = {}
  for role in ("actor", "learner", "evaluator"):
    with open(os.path.join(run_dir, "metrics", f"{role}.csv")) as f:
      values[role] = [{k: v for k, v in row.items() if k not in TIME_COLUMNS} for row in csv.DictReader(f)]
  return values


@pytest.mark.slow
def test_deterministic_runs_repeat_bytes_and_metrics(tmp_path):
  summaries = []
  for name, seed in (("a", 0), ("b", 0), ("c", 1)):
    exp = ExperimentConfig(seed=seed, deterministic=True, run_dir=str(tmp_path / name), **SHORT)
    summaries.append(run(exp, SHORT_AGENT))
  a, b, c = summaries
  assert a["replay"] == "seeded" and a["learner_steps"] > 0
  assert a["params_digest"] == b["params_digest"]
  assert _metric_values(a["run_dir"]) == _metric_values(b["run_dir"])
  assert len(_metric_values(a["run_dir"])["learner"]) >= 3
  assert c["params_digest"] != a["params_digest"]


@pytest.mark.needs_reverb
def test_reverb_run_writes_the_run_directory(tmp_path):
  exp = ExperimentConfig(seed=0, run_dir=str(tmp_path / "run"), **SHORT)
  summary = run(exp, SHORT_AGENT)
  run_dir = summary["run_dir"]
  assert summary["replay"] == "reverb"
  # 3000 steps, learning from 500 on at one update per env step (samples_per_insert == batch_size).
  assert 2_000 <= summary["learner_steps"] <= 2_600
  for key in ("agent", "env", "seed", "actor_steps", "learner_steps", "wall_seconds", "eval_return",
              "best_eval_return", "reward_threshold", "steps_to_threshold", "params_digest"):
    assert key in json.load(open(os.path.join(run_dir, "summary.json")))
  assert summary["reward_threshold"] == 475.0 and len(summary["params_digest"]) == 64
  config = json.load(open(os.path.join(run_dir, "config.json")))
  assert ExperimentConfig(**config["experiment"]) == exp
  assert dqn.Config(**{k: tuple(v) if isinstance(v, list) else v for k, v in config["agent"].items()}) == SHORT_AGENT
  assert os.path.getsize(os.path.join(run_dir, "plots", "learning_curve.png")) > 10_000
  assert any(name.startswith("events.out.tfevents") for name in os.listdir(os.path.join(run_dir, "tensorboard")))
  learner_rows = list(csv.DictReader(open(os.path.join(run_dir, "metrics", "learner.csv"))))
  # One row per log_every env steps once learning began, the learner's step count rising to the summary's;
  # a Huber TD loss of a network still learning is positive and finite.
  steps = [int(float(row["learner_steps"])) for row in learner_rows]
  assert len(steps) >= 2 and steps == sorted(set(steps)) and steps[-1] <= summary["learner_steps"], steps
  losses = [float(row["loss"]) for row in learner_rows]
  assert all(0 < loss < float("inf") for loss in losses), losses


# DQN's and SAC's are learning runs of minutes on a slow 2-core box (make test-long); the same wiring runs in
# this file's shorter runs, and `make train` (DQN, 50k env steps) must reach 475 in CI's core view.
@pytest.mark.parametrize("agent, env, steps, eval_every, threshold", [
    pytest.param("dqn", "CartPole-v1", 50_000, 2_500, None, marks=pytest.mark.long),  # gymnasium's threshold: 475
    pytest.param("sac", "Pendulum-v1", 20_000, 2_000, -200.0, marks=pytest.mark.long),
    ("ppo", "CartPole-v1", 100_000, 5_000, None),
    ("impala", "CartPole-v1", 200_000, 10_000, None),
])
@pytest.mark.slow
def test_shipped_defaults_reach_the_threshold(tmp_path, agent, env, steps, eval_every, threshold):
  """Each agent's shipped defaults reach the mean greedy return (10 episodes) the issue sets,
  within its step budget, on seed 0 (deterministic replay, so the result repeats)."""
  exp = ExperimentConfig(agent=agent, env=env, seed=0, steps=steps, deterministic=True, stop_at_threshold=True,
                         eval_every=eval_every, reward_threshold=threshold, run_dir=str(tmp_path / agent),
                         progress_seconds=0)
  summary = run(exp, get_agent(agent).Config())
  assert summary["steps_to_threshold"] is not None and summary["steps_to_threshold"] <= steps, summary
  assert summary["best_eval_return"] >= summary["reward_threshold"]


@pytest.mark.slow
def test_gaussian_ppo_learns_pendulum(tmp_path):
  """PPO's Gaussian head on a Box action space: the README's Pendulum flags reach -250 within
  100k env steps on seed 0 (measured: -204 at 30k, deterministic replay)."""
  from jrl.agents import ppo
  exp = ExperimentConfig(agent="ppo", env="Pendulum-v1", seed=0, steps=100_000, deterministic=True,
                         stop_at_threshold=True, eval_every=10_000, reward_threshold=-250.0,
                         run_dir=str(tmp_path / "pendulum"), progress_seconds=0)
  cfg = ppo.Config(sequence_length=128, batch_size=8, num_epochs=10, num_minibatches=16, learning_rate=3e-4,
                   discount=0.9, entropy_cost=0.0)
  summary = run(exp, cfg)
  assert summary["steps_to_threshold"] is not None and summary["best_eval_return"] >= -250.0, summary


@pytest.mark.needs_reverb
def test_ppo_through_a_reverb_queue(tmp_path):
  from jrl.agents import ppo
  exp = ExperimentConfig(agent="ppo", seed=0, steps=4_096, eval_every=2_048, eval_episodes=2,
                         run_dir=str(tmp_path / "ppoq"), progress_seconds=0)
  summary = run(exp, ppo.Config())
  assert summary["replay"] == "reverb"
  assert summary["learner_steps"] == 4_096 // (8 * 64)  # every trajectory used by exactly one call

