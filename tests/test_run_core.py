"""What every kind of run leaves behind is the same: a brief run of each backend (embedded with
Reverb, embedded `--deterministic`, `--distributed` local_mp, `--backend device`), compared."""

import glob
import json
import os
import subprocess
import sys

import pytest

from jrl.experiment.summary import KEYS

pytestmark = [pytest.mark.slow, pytest.mark.needs_reverb, pytest.mark.needs_gymnax]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BRIEF = ["--agent", "dqn", "--steps", "2000", "--eval_every", "1000", "--eval_episodes", "2", "--min_replay_size", "500",
         "--hidden_sizes", "32,32", "--num_envs", "4", "--progress_seconds", "0"]
RUNS = {
    "embedded": ["--env", "CartPole-v1"],
    "deterministic": ["--env", "CartPole-v1", "--deterministic"],
    "distributed": ["--env", "CartPole-v1", "--distributed", "--num_actors", "2"],
    "device": ["--env", "gymnax:CartPole-v1", "--backend", "device"],
}
KIND = {"embedded": "embedded", "deterministic": "embedded", "distributed": "distributed", "device": "device"}
# What a run directory holds, whatever ran it: (what, glob under the run directory).
FILE_KINDS = (
    ("config", "config.json"), ("summary", "summary.json"), ("metrics CSVs", "metrics/*.csv"),
    ("TensorBoard events", "tensorboard/**/events.out.tfevents.*"), ("best policy", "policies/best.msgpack"),
    ("final policy", "policies/final.msgpack"), ("latest policy", "policies/latest.msgpack"),
    ("checkpoint", "checkpoints/ckpt-*/manifest.json"), ("report", "report.md"),
    ("learning curve", "plots/learning_curve.png"),
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  folder = tmp_path_factory.mktemp("kinds")
  made = {}
  for name, flags in RUNS.items():
    run_dir = str(folder / name)
    out = subprocess.run([sys.executable, "-m", "launch.train", *BRIEF, *flags, "--run_dir", run_dir], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, (name, out.stdout[-3000:] + out.stderr[-3000:])
    made[name] = run_dir
  return made


def test_every_backend_writes_one_summary_schema(runs):
  summaries = {name: json.load(open(os.path.join(run_dir, "summary.json"))) for name, run_dir in runs.items()}
  for name, summary in summaries.items():
    assert tuple(summary) == KEYS, (name, sorted(set(summary) ^ set(KEYS)))
    assert summary["kind"] == KIND[name] and summary["actor_steps"] >= 2000, (name, summary)
    # Two evaluation points (1000, 2000); a distributed evaluator that starts after the actors' first
    # 2,000 steps (8 processes starting on 2 cores) can evaluate only at the budget.
    assert summary["evaluations"] >= (1 if name == "distributed" else 2), (name, summary)
    assert summary["checkpoints"] and summary["params_digest"], (name, summary)
    assert summary["bottleneck"] and summary["rates"]["env_steps_per_second"] > 0, (name, summary)
  assert summaries["deterministic"]["replay"] == "seeded" and summaries["embedded"]["replay"] == "reverb"
  assert summaries["distributed"]["details"]["num_actors"] == 2
  assert summaries["device"]["details"]["loop_compiles"] == 0


def test_every_backend_writes_the_same_kinds_of_files(runs):
  for name, run_dir in runs.items():
    missing = [what for what, pattern in FILE_KINDS if not glob.glob(os.path.join(run_dir, pattern), recursive=True)]
    assert not missing, (name, missing, sorted(os.listdir(run_dir)))
