"""Reusable policies: a real run's snapshots reloaded by `jrl.load_policy` and `launch.evaluate`."""

import csv
import json
import os
import re
import shutil
import subprocess
import sys

import imageio.v2 as imageio
import numpy as np
import pytest

import jrl
from jrl.actors.evaluator import Evaluator
from jrl.agents import dqn
from jrl.experiment.config import ExperimentConfig
from jrl.run.embedded import run
from jrl.experiment.snapshots import load_config, load_params, load_snapshot, saved_snapshots

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROG = "python -m launch.evaluate"
EXP = dict(seed=0, deterministic=True, steps=3_000, eval_every=1_000, eval_episodes=3, log_every=500,
           progress_seconds=0)
AGENT = dqn.Config(min_replay_size=500, hidden_sizes=(32, 32))
RESULT = re.compile(r"^return (\S+) ± (\S+) over (\d+) episodes", re.M)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("evaluate") / "run")
  run(ExperimentConfig(run_dir=path, **EXP), AGENT)
  return path


def _evaluate(*args):
  return subprocess.run([sys.executable, "-m", "launch.evaluate", *args], cwd=ROOT, text=True,
                        capture_output=True, timeout=300)


def _best_row(run_dir):
  with open(os.path.join(run_dir, "metrics", "evaluator.csv")) as f:
    rows = list(csv.DictReader(f))
  returns = [float(row["eval_return"]) for row in rows]
  return rows[int(np.argmax(returns))]  # the first of equal bests, as the runner keeps


def test_the_run_saved_its_snapshots_and_config(run_dir):
  assert {"best", "final"} <= set(saved_snapshots(run_dir))
  exp, agent_cfg = load_config(run_dir)
  assert exp == ExperimentConfig(run_dir=run_dir, **EXP)
  assert agent_cfg == AGENT and isinstance(agent_cfg.hidden_sizes, tuple)


def test_evaluate_best_repeats_the_runs_best_evaluation(run_dir):
  info = json.load(open(os.path.join(run_dir, "policies", "best.json")))
  row = _best_row(run_dir)
  assert info["eval_return"] == float(row["eval_return"]) and info["actor_steps"] == int(row["actor_steps"])
  assert info["eval_index"] > 0  # not the first evaluation: the index matters

  # In process: the same Evaluator, started at the recorded index, gives the recorded mean bit for bit.
  snapshot = load_snapshot(run_dir, "best")
  policy = dqn.make_policy(snapshot.parts.networks, AGENT, evaluation=True)
  evaluator = Evaluator("CartPole-v1", policy, info["eval_episodes"], info["eval_seed"], first_index=info["eval_index"])
  returns = evaluator.run(snapshot.params)
  evaluator.close()
  assert float(np.mean(returns)) == info["eval_return"]

  out = _evaluate(run_dir, "--which", "best")
  assert out.returncode == 0, out.stderr
  mean, std, episodes = RESULT.search(out.stdout).groups()
  assert (mean, std, int(episodes)) == (f"{float(row['eval_return']):.3f}", f"{float(row['eval_return_std']):.3f}",
                                        EXP["eval_episodes"])
  assert f"eval_index {info['eval_index']}" in out.stdout

  other = _evaluate(run_dir, "--which", "best", "--episodes", "5", "--seed", "7")
  assert other.returncode == 0, other.stderr
  assert RESULT.search(other.stdout).group(3) == "5" and "envs reset with seeds 7..11" in other.stdout


def test_evaluate_final_repeats_the_runs_last_evaluation(run_dir):
  info = json.load(open(os.path.join(run_dir, "policies", "final.json")))
  if "eval_index" not in info:
    pytest.skip("final.json records no eval_seed/eval_index: the runner does not write them yet")
  with open(os.path.join(run_dir, "metrics", "evaluator.csv")) as f:
    last = list(csv.DictReader(f))[-1]
  out = _evaluate(run_dir, "--which", "final")
  assert out.returncode == 0, out.stderr
  assert RESULT.search(out.stdout).groups()[:2] == (f"{float(last['eval_return']):.3f}",
                                                    f"{float(last['eval_return_std']):.3f}")


def test_load_policy_acts_greedily_on_batches_and_single_observations(run_dir):
  policy = jrl.load_policy(run_dir)
  snapshot = load_snapshot(run_dir, "best")
  params = load_params(run_dir, "best")
  obs = np.random.default_rng(0).normal(0, 0.5, (64, 4)).astype(np.float32)
  greedy = np.argmax(np.asarray(snapshot.parts.networks.apply(params, obs)), axis=-1)
  actions = policy(obs)
  assert isinstance(actions, np.ndarray) and actions.shape == (64,)
  np.testing.assert_array_equal(actions, greedy)
  assert len(set(greedy.tolist())) == 2  # the observations reach both actions: the check has teeth
  single = policy(obs[3].tolist())
  assert np.shape(single) == () and single == greedy[3]
  assert policy.info["eval_return"] == snapshot.info["eval_return"]
  with pytest.raises(ValueError, match="observations must be shaped"):
    policy(np.zeros((2, 5)))
  final = jrl.load_policy(run_dir, "final")
  assert final(obs).shape == (64,)


def test_import_jrl_stays_light():
  code = "import sys, jrl; print('jax' in sys.modules, callable(jrl.load_policy), 'jax' in sys.modules)"
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert out.stdout.split() == ["False", "True", "True"], out.stderr


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:os.fork")  # imageio starts ffmpeg to decode
def test_video_is_a_playable_h264_mp4(run_dir, tmp_path):
  path = tmp_path / "out.mp4"
  out = _evaluate(run_dir, "--which", "final", "--episodes", "2", "--video", str(path))
  assert out.returncode == 0, out.stderr
  assert out.stderr == ""
  data = path.read_bytes()
  assert data[4:8] == b"ftyp"  # an ISO base media (MP4) file starts with its ftyp box
  reader = imageio.get_reader(str(path))
  assert reader.get_meta_data()["codec"] == "h264"
  shapes = [frame.shape for frame in reader]
  reader.close()
  returns = [float(r) for r in re.search(r"returns ([^;]+);", out.stdout).group(1).split(", ")]
  # CartPole pays 1 per step: one frame per step plus each episode's first.
  assert len(shapes) == sum(returns) + 2 > 2
  assert set(shapes) == {(400, 600, 3)}
  assert sorted(os.listdir(tmp_path)) == ["out.mp4"]  # no temporary file left behind


def test_a_relative_video_path_is_inside_the_run():
  """`--video out.mp4` once wrote into the working directory (the repository root, for the docs'
  commands); the run's other outputs are in its folder. tests/test_front_door.py runs it."""
  from launch.evaluate import video_path
  assert video_path("runs/dqn-s0", "out.mp4") == os.path.join("runs/dqn-s0", "out.mp4")
  assert video_path("runs/dqn-s0", "videos/best.mp4") == os.path.join("runs/dqn-s0", "videos", "best.mp4")
  absolute = os.path.join(os.path.abspath(os.sep), "tmp", "out.mp4")
  assert video_path("runs/dqn-s0", absolute) == absolute


@pytest.mark.slow
def test_bad_input_gives_one_line_and_status_2(run_dir, tmp_path):
  no_latest = str(tmp_path / "no_latest")
  shutil.copytree(run_dir, no_latest)
  for suffix in (".msgpack", ".json"):
    os.unlink(os.path.join(no_latest, "policies", "latest" + suffix))
  corrupt = str(tmp_path / "corrupt")
  shutil.copytree(run_dir, corrupt)
  best = os.path.join(corrupt, "policies", "best.msgpack")
  data = open(best, "rb").read()
  open(best, "wb").write(data[:len(data) // 2])
  broken_config = str(tmp_path / "broken_config")
  shutil.copytree(run_dir, broken_config)
  open(os.path.join(broken_config, "config.json"), "w").write('{"experiment": {')
  os.makedirs(tmp_path / "not_a_run")
  video_dir = tmp_path / "videos"
  os.makedirs(video_dir)
  cases = {
      "missing dir": ([str(tmp_path / "nope")], "run_dir: '" + str(tmp_path / "nope") + "' does not exist"),
      "not a run": ([str(tmp_path / "not_a_run")], "is not a run directory (no config.json)"),
      "broken config": ([broken_config], "config.json' is not readable JSON"),
      "missing snapshot": ([no_latest, "--which", "latest"], "no 'latest' policy snapshot in"),
      "corrupt snapshot": ([corrupt], f"snapshot: '{best}' is corrupt or truncated"),
      "zero episodes": ([run_dir, "--episodes", "0"], "episodes: must be > 0, got 0"),
      "negative episodes": ([run_dir, "--episodes", "-3"], "episodes: must be > 0, got -3"),
      "episodes not a number": ([run_dir, "--episodes", "many"], "argument --episodes: invalid int value"),
      "unknown snapshot name": ([run_dir, "--which", "worst"], "argument --which: invalid choice: 'worst'"),
  }
  procs = {name: subprocess.Popen([sys.executable, "-m", "launch.evaluate", *args,
                                   "--video", str(video_dir / f"{i}.mp4")], cwd=ROOT, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
           for i, (name, (args, _)) in enumerate(cases.items())}
  for name, proc in procs.items():
    out, err = proc.communicate(timeout=300)
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 2, (name, err)
    assert len(lines) == 1 and lines[0].startswith(f"{PROG}: error: "), (name, err)
    assert cases[name][1] in lines[0], (name, lines)
    assert out == "", (name, out)
  assert os.listdir(video_dir) == []  # nothing was written
  assert "saved: best, final)" in subprocess.run(
      [sys.executable, "-m", "launch.evaluate", no_latest, "--which", "latest"], cwd=ROOT, text=True,
      capture_output=True, timeout=300).stderr
