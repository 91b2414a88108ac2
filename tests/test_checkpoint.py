"""Checkpoints and --resume: atomic writes, damage detection, SIGKILL at random instants,
bit-exact resume of deterministic runs, and one-line errors for bad resume input."""

import csv
import glob
import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from jrl.agents import dqn
from jrl.errors import ConfigError
from jrl.experiment.builder import build_agent_parts
from jrl.experiment.checkpoint import Checkpointer, checkpoint_to_resume
from jrl.experiment.config import ExperimentConfig
from jrl.run.embedded import run
from jrl.learners.learner import params_digest
from test_runs import _metric_values

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ["--eval_every", "1000", "--eval_episodes", "3", "--min_replay_size", "500", "--hidden_sizes", "32,32",
         "--progress_seconds", "0"]


def _launch(args):
  return subprocess.Popen([sys.executable, "-m", "launch.train", *args], cwd=ROOT, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _wait_for(predicate, proc, timeout=300.0, poll=0.002):
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if predicate():
      return True
    if proc.poll() is not None:
      return False
    time.sleep(poll)
  raise TimeoutError("condition not reached")


def _checkpoint_counters(run_dir):
  return [Checkpointer(run_dir).verify(path).manifest["counters"] for path in Checkpointer(run_dir).all()]


def test_checkpointer_is_atomic_verified_and_keeps_the_last_k(tmp_path):
  cfg = dqn.Config(hidden_sizes=(8,))
  parts = build_agent_parts("dqn", "CartPole-v1", cfg)
  learner = dqn.make_learner(parts.networks, cfg)
  states = [learner.init(jax.random.PRNGKey(i)) for i in range(4)]
  checkpointer = Checkpointer(str(tmp_path), keep=2)
  for i, state in enumerate(states):
    checkpointer.save(state, {"i": i}, {"actor_steps": 100 * i},
                      write_replay=lambda folder, i=i: open(os.path.join(folder, "r.bin"), "wb").write(bytes([i]) * 64))
  assert [os.path.basename(p) for p in checkpointer.all()] == ["ckpt-000003", "ckpt-000004"]
  latest = checkpointer.latest()
  restored = Checkpointer.restore_learner(latest, states[0])
  assert params_digest(restored) == params_digest(states[3]) != params_digest(states[2])
  assert type(restored) is type(states[3])
  assert Checkpointer.read_run_state(latest) == {"i": 3}
  assert latest.manifest["counters"]["actor_steps"] == 300

  # A writer killed mid-way leaves only a staging folder: not a checkpoint, cleaned on start.
  os.makedirs(os.path.join(checkpointer.root, ".staging-000005", "learner"))
  assert checkpointer.latest().path == latest.path
  checkpointer.clean_partial()
  assert sorted(os.listdir(checkpointer.root)) == ["ckpt-000003", "ckpt-000004"]

  # Damage is named: a truncated replay file, then a changed byte in the run state.
  replay_file = os.path.join(latest.path, "replay", "r.bin")
  with open(replay_file, "r+b") as f:
    f.truncate(10)
  with pytest.raises(ConfigError, match=r"resume: checkpoint .*ckpt-000004 is damaged: replay/r.bin has 10 bytes, "
                                        r"64 were written \(truncated\?\)"):
    checkpointer.latest()
  older = checkpointer.all()[0]
  with open(os.path.join(older, "run_state.json"), "r+b") as f:
    f.seek(5)
    byte = f.read(1)
    f.seek(5)
    f.write(bytes([byte[0] ^ 0xFF]))
  with pytest.raises(ConfigError, match="run_state.json does not match its checksum"):
    checkpointer.verify(older)


@pytest.mark.slow
def test_deterministic_run_killed_and_resumed_equals_the_uninterrupted_run(tmp_path):
  steps = 8_000
  reference = run(ExperimentConfig(seed=3, steps=steps, deterministic=True, eval_every=1_000, eval_episodes=3,
                                   progress_seconds=0, run_dir=str(tmp_path / "reference")),
                  dqn.Config(min_replay_size=500, hidden_sizes=(32, 32)))

  run_dir = str(tmp_path / "killed")
  args = ["--seed", "3", "--steps", str(steps), "--deterministic", "--checkpoint_every_steps", "1000", *SMALL]
  proc = _launch([*args, "--run_dir", run_dir])
  # Kill once a checkpoint past a third of the budget exists, while the run goes on.
  reached = _wait_for(lambda: os.path.isdir(os.path.join(run_dir, "checkpoints")) and any(
      c["actor_steps"] >= steps // 3 for c in _checkpoint_counters(run_dir)), proc, poll=0.01)
  assert reached and proc.poll() is None, "the run ended before it could be killed"
  proc.send_signal(signal.SIGKILL)
  proc.communicate()
  killed_at = max(c["actor_steps"] for c in _checkpoint_counters(run_dir))
  assert killed_at < steps and not os.path.exists(os.path.join(run_dir, "summary.json"))

  resumed = subprocess.run([sys.executable, "-m", "launch.train", "--resume", run_dir], cwd=ROOT, text=True,
                           capture_output=True, timeout=600)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  summary = json.load(open(os.path.join(run_dir, "summary.json")))
  assert summary["resumed"] and summary["actor_steps"] == reference["actor_steps"]
  assert summary["params_digest"] == reference["params_digest"]
  assert _metric_values(run_dir) == _metric_values(reference["run_dir"])


# The last session: 2,500 env steps past the last checkpoint (slow tier, CI), or on to the
# threshold (long tier, `make test-long`: about a minute more of learning).
LAST_SESSIONS = [pytest.param(False, id="kills"), pytest.param(True, id="to-threshold", marks=pytest.mark.long)]


@pytest.mark.slow
@pytest.mark.needs_reverb
@pytest.mark.parametrize("to_threshold", LAST_SESSIONS)
def test_reverb_run_survives_sigkill_at_random_instants_and_reaches_the_threshold(tmp_path, to_threshold):
  """Five SIGKILLs, alternately while a checkpoint is being written and at a random
  moment after one was committed; after each, every checkpoint left restores and the
  counters never went back. The last session finishes from the last checkpoint: 2,500 env
  steps more, or, resumed with --stop_at_threshold, the budget (the threshold, or 100k env
  steps), where DQN still solves CartPole."""
  rng = np.random.default_rng(0)
  run_dir = str(tmp_path / "survivor")
  checkpoints = os.path.join(run_dir, "checkpoints")
  # Budget: at most 100k env steps (Reverb runs are not deterministic; seed 0 has reached 475
  # between 30k and 50k steps). The killed sessions do not stop at the threshold, so none can
  # end before its kill; the last session does.
  base = ["--seed", "0", "--steps", "100000", "--checkpoint_every_steps", "2500", "--progress_seconds", "0"]
  cfg = dqn.Config()
  template = dqn.make_learner(build_agent_parts("dqn", "CartPole-v1", cfg).networks, cfg).init(jax.random.PRNGKey(0))
  history = []
  for kill in range(5):
    proc = _launch(["--run_dir", run_dir, *base] if kill == 0 else ["--resume", run_dir])
    known = set(os.listdir(checkpoints)) if os.path.isdir(checkpoints) else set()
    listing = lambda: os.listdir(checkpoints) if os.path.isdir(checkpoints) else []
    if kill % 2 == 0:  # during a write: a staging folder exists
      hit = _wait_for(lambda: any(n.startswith(".staging-") for n in listing()), proc)
    else:  # between writes: a random moment after a new checkpoint was committed
      hit = _wait_for(lambda: any(n.startswith("ckpt-") and n not in known for n in listing()), proc, poll=0.01)
      time.sleep(rng.uniform(0.0, 2.0))
    assert hit and proc.poll() is None, f"session {kill} ended before its kill: {proc.communicate()[1][-2000:]}"
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    for path in Checkpointer(run_dir).all():  # every checkpoint on disk restores
      info = Checkpointer(run_dir).verify(path)
      Checkpointer.restore_learner(info, template)
      assert Checkpointer.read_run_state(info)["actor"]["env_steps"] == info.manifest["counters"]["actor_steps"]
    latest = Checkpointer(run_dir).latest()
    if latest is not None:
      history.append(latest.manifest["counters"])
  for before, after in zip(history, history[1:]):
    assert after["actor_steps"] >= before["actor_steps"] and after["learner_steps"] >= before["learner_steps"]
  assert history and history[-1]["actor_steps"] > 0

  until = ["--stop_at_threshold"] if to_threshold else ["--steps", str(int(history[-1]["actor_steps"]) + 2500)]
  final = subprocess.run([sys.executable, "-m", "launch.train", "--resume", run_dir, *until],
                         cwd=ROOT, text=True, capture_output=True, timeout=900)
  assert final.returncode == 0, final.stderr[-3000:]
  summary = json.load(open(os.path.join(run_dir, "summary.json")))
  assert summary["actor_steps"] >= history[-1]["actor_steps"] and summary["learner_steps"] >= history[-1]["learner_steps"]
  if to_threshold:
    assert summary["steps_to_threshold"] is not None and summary["best_eval_return"] >= 475.0, summary
  else:
    assert summary["resumed"] and summary["actor_steps"] >= history[-1]["actor_steps"] + 2500, summary
  steps = [float(r["actor_steps"]) for r in csv.DictReader(open(os.path.join(run_dir, "metrics", "actor.csv")))]
  assert steps == sorted(set(steps)), "metric rows repeated or went back across resumes"


def _files_snapshot(folder):
  snapshot = {}
  for directory, _, names in os.walk(folder):
    for name in names:
      path = os.path.join(directory, name)
      snapshot[path] = (os.path.getsize(path), os.path.getmtime(path))
  return snapshot


@pytest.mark.slow
def test_bad_resume_and_run_dir_input_is_one_line_and_changes_nothing(tmp_path):
  run_dir = str(tmp_path / "done")
  finished = subprocess.run([sys.executable, "-m", "launch.train", "--steps", "2000", "--deterministic",
                             "--run_dir", run_dir, *SMALL], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert finished.returncode == 0, finished.stderr
  a_file = tmp_path / "a_file"
  a_file.write_text("not a folder")
  (tmp_path / "empty").mkdir()
  damaged = str(tmp_path / "damaged")
  subprocess.run(["cp", "-r", run_dir, damaged], check=True)
  latest = Checkpointer(damaged).latest()
  with open(os.path.join(latest.path, "run_state.json"), "r+b") as f:
    f.truncate(100)
  cases = {
      "missing": (["--resume", str(tmp_path / "nope")], "resume: '{}' does not exist".format(tmp_path / "nope")),
      "not a run": (["--resume", str(tmp_path / "empty")],
                    "resume: '{}' is not a run directory (no config.json)".format(tmp_path / "empty")),
      "damaged": (["--resume", damaged, "--steps", "4000"], "is damaged: run_state.json has 100 bytes"),
      "other agent": (["--resume", run_dir, "--agent", "ppo"],
                      "agent: cannot change when resuming: the run has 'dqn', got 'ppo'"),
      "other env": (["--resume", run_dir, "--env", "Acrobot-v1"],
                    "env: cannot change when resuming: the run has 'CartPole-v1', got 'Acrobot-v1'"),
      "fixed field": (["--resume", run_dir, "--learning_rate", "0.1"], "learning_rate: cannot change when resuming"),
      "finished": (["--resume", run_dir], "steps: the run already has 2000 env steps"),
      "run_dir is a file": (["--run_dir", str(a_file)], "run_dir: '{}' is an existing file".format(a_file)),
      "run_dir holds a run": (["--run_dir", run_dir], "already holds a run; continue it with --resume"),
  }
  before = _files_snapshot(str(tmp_path))
  procs = {name: _launch(args) for name, (args, _) in cases.items()}
  for name, proc in procs.items():
    _, err = proc.communicate(timeout=300)
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 2, (name, err[-2000:])
    assert len(lines) == 1 and lines[0].startswith("python -m launch.train: error: "), (name, err[-2000:])
    assert cases[name][1] in lines[0], (name, lines[0])
  assert _files_snapshot(str(tmp_path)) == before
  assert a_file.read_text() == "not a folder"


def _three_checkpoints(run_dir):
  """A run's checkpoints as runs write them (orbax learner state, run state, the seeded replay's
  file, the manifest with the counters), at 1000, 2000 and 3000 env steps."""
  from jrl.experiment.checkpoint_formats import write
  from jrl.run.embedded import SEEDED_REPLAY
  cfg = dqn.Config(hidden_sizes=(8,))
  learner = dqn.make_learner(build_agent_parts("dqn", "CartPole-v1", cfg).networks, cfg)
  states = [learner.init(jax.random.PRNGKey(i)) for i in range(3)]
  checkpointer = Checkpointer(run_dir, keep=3)
  for i, state in enumerate(states, 1):
    def write_replay(folder, i=i):
      write(folder, SEEDED_REPLAY, {"buffer": np.full(4096, i, np.uint8)})
    checkpointer.save(state, {"learner_steps": 10 * i}, {"actor_steps": 1000 * i}, write_replay)
  return checkpointer, states


# Each part of a checkpoint, and the file of it to cut short.
CHECKPOINT_PARTS = {
    "run state": "run_state.json",
    "run state arrays": "run_state.npz",
    "learner metadata": "learner/_METADATA",
    "learner arrays": "learner/ocdbt.process_0/d/*",  # the largest of orbax's data files
    "replay": "replay/seeded_buffer.npz",
    "manifest (counters)": "manifest.json",
}


def _truncate(checkpoint, part):
  """Cuts the file `part` of a checkpoint to half its size; its path in the checkpoint."""
  paths = sorted(glob.glob(os.path.join(checkpoint, part)), key=os.path.getsize)
  assert paths, (checkpoint, part, os.listdir(checkpoint))
  with open(paths[-1], "r+b") as f:
    f.truncate(os.path.getsize(paths[-1]) // 2)
  return os.path.relpath(paths[-1], checkpoint)


@pytest.mark.parametrize("part", list(CHECKPOINT_PARTS), ids=list(CHECKPOINT_PARTS))
def test_a_resume_whose_newest_checkpoint_is_damaged_continues_from_the_newest_intact_one(tmp_path, capsys, part):
  run_dir = str(tmp_path / "run")
  checkpointer, states = _three_checkpoints(run_dir)
  newest = checkpointer.all()[-1]
  damaged_file = _truncate(newest, CHECKPOINT_PARTS[part])
  capsys.readouterr()

  info = checkpoint_to_resume(run_dir, steps=10_000)
  out, err = capsys.readouterr()
  assert os.path.basename(info.path) == "ckpt-000002" and info.manifest["counters"]["actor_steps"] == 2000
  assert params_digest(Checkpointer.restore_learner(info, states[0])) == params_digest(states[1])
  assert Checkpointer.read_run_state(info) == {"learner_steps": 20}
  # One line on stderr: the damaged checkpoint and its file, where it went, the checkpoint resumed
  # and the env steps lost (unknown when the manifest, which holds the counters, is the damage).
  kept = os.path.join(checkpointer.root, "damaged", "ckpt-000003")
  manifest = part.startswith("manifest")
  lost = "the env steps it held are lost" if manifest else "1000 env steps lost"
  damage = ("unreadable manifest.json (JSONDecodeError)" if manifest
            else f"{damaged_file} has {os.path.getsize(os.path.join(kept, damaged_file))} bytes, ")
  assert err.splitlines() == [err.strip()] and err.startswith(
      f"[resume] checkpoints/ckpt-000003 is damaged: {damage}"), err
  assert err.strip().endswith("; set aside in checkpoints/damaged/, continuing from checkpoints/ckpt-000002 at 2000 "
                              f"env steps: {lost} (--resume_strict refuses instead)"), err
  assert out == "[resume] continuing from checkpoints/ckpt-000002 at 2000 env steps\n"
  # Kept aside as it was (its cut file too), out of the checkpoints a resume or the pruning sees.
  assert os.path.isfile(os.path.join(kept, damaged_file)) and not os.path.exists(newest)
  assert [os.path.basename(p) for p in checkpointer.all()] == ["ckpt-000001", "ckpt-000002"]


def test_damaged_checkpoints_are_kept_through_pruning_and_never_overwritten(tmp_path, capsys):
  run_dir = str(tmp_path / "run")
  checkpointer, states = _three_checkpoints(run_dir)
  _truncate(checkpointer.all()[-1], "run_state.json")
  _truncate(checkpointer.all()[-2], "replay/*")  # the two newest damaged: back to the first
  capsys.readouterr()
  assert os.path.basename(checkpoint_to_resume(run_dir, steps=10_000).path) == "ckpt-000001"
  err = capsys.readouterr().err
  assert len(err.splitlines()) == 1 and err.startswith("[resume] checkpoints/ckpt-000003 is damaged: run_state.json "
                                                       "has ") and \
      "; checkpoints/ckpt-000002 is damaged: replay/seeded_buffer.npz has " in err and \
      "continuing from checkpoints/ckpt-000001 at 1000 env steps: 2000 env steps lost" in err, err
  damaged = os.path.join(checkpointer.root, "damaged")
  kept = {name: _files_snapshot(os.path.join(damaged, name)) for name in ("ckpt-000002", "ckpt-000003")}
  # The resumed run checkpoints on (ckpt-000002 to 5 again, keeping 3): pruning never reaches damaged/.
  for i in range(4):
    checkpointer.save(states[0], {"i": i}, {"actor_steps": 2000 + 1000 * i})
  assert [os.path.basename(p) for p in checkpointer.all()] == ["ckpt-000003", "ckpt-000004", "ckpt-000005"]
  assert {name: _files_snapshot(os.path.join(damaged, name)) for name in kept} == kept
  # Every checkpoint damaged: refused (no intact one to continue from), nothing moved.
  for path, part in zip(checkpointer.all(), ("manifest.json", "learner/_METADATA", "run_state.json")):
    _truncate(path, part)
  before = _files_snapshot(run_dir)
  with pytest.raises(ConfigError, match=r"resume: checkpoint .*ckpt-000005 is damaged: run_state.json has \d+ bytes, "
                                        r"\d+ were written \(truncated\?\), and the run has no intact checkpoint "
                                        r"before it"):
    checkpoint_to_resume(run_dir, steps=10_000)
  assert _files_snapshot(run_dir) == before
  # A second damaged ckpt-000003 (its index used again) is kept beside the first, not over it.
  assert checkpointer.set_aside(checkpointer.all()[0]) == os.path.join(damaged, "ckpt-000003.1")
  assert {name: _files_snapshot(os.path.join(damaged, name)) for name in kept} == kept


def test_resume_strict_refuses_a_damaged_newest_checkpoint_and_moves_nothing(tmp_path, capsys):
  run_dir = str(tmp_path / "run")
  checkpointer, _ = _three_checkpoints(run_dir)
  _truncate(checkpointer.all()[-1], "run_state.json")
  before = _files_snapshot(run_dir)
  capsys.readouterr()
  with pytest.raises(ConfigError, match=r"^resume: checkpoint .*ckpt-000003 is damaged: run_state.json has \d+ bytes, "
                                        r"\d+ were written \(truncated\?\); without --resume_strict the run "
                                        r"continues from checkpoints/ckpt-000002 at 2000 env steps$"):
    checkpoint_to_resume(run_dir, steps=10_000, strict=True)
  assert _files_snapshot(run_dir) == before and capsys.readouterr() == ("", "")


@pytest.mark.slow
def test_a_run_whose_newest_checkpoint_is_cut_short_resumes_from_the_one_before(tmp_path):
  """As the issue met it: a run's newest run state truncated; --resume_strict refuses, a plain
  --resume sets the checkpoint aside, says so, and continues from the one before to the same
  bytes as a run never stopped."""
  reference = run(ExperimentConfig(seed=0, steps=4_000, deterministic=True, eval_every=1_000, eval_episodes=3,
                                   progress_seconds=0, run_dir=str(tmp_path / "reference")),
                  dqn.Config(min_replay_size=500, hidden_sizes=(32, 32)))
  run_dir = str(tmp_path / "run")
  # Step counts as people write them (3k, 1e3): checkpoints at 1000, 2000 and 3000 env steps.
  first = subprocess.run([sys.executable, "-m", "launch.train", "--steps", "3k", "--deterministic",
                          "--checkpoint_every_steps", "1e3", *SMALL, "--run_dir", run_dir],
                         cwd=ROOT, text=True, capture_output=True, timeout=300)
  assert first.returncode == 0, first.stderr[-3000:]
  assert [c["actor_steps"] for c in _checkpoint_counters(run_dir)] == [1000, 2000, 3000]
  cut = _truncate(Checkpointer(run_dir).all()[-1], "run_state.json")

  resume = [sys.executable, "-m", "launch.train", "--resume", run_dir, "--steps", "4k"]
  before = _files_snapshot(run_dir)
  strict = subprocess.run([*resume, "--resume_strict"], cwd=ROOT, text=True, capture_output=True, timeout=300)
  assert strict.returncode == 2 and len(strict.stderr.strip().splitlines()) == 1, strict.stderr[-3000:]
  assert strict.stderr.startswith("python -m launch.train: error: resume: checkpoint ") and \
      f"ckpt-000003 is damaged: {cut} has " in strict.stderr and strict.stderr.strip().endswith(
          "; without --resume_strict the run continues from checkpoints/ckpt-000002 at 2000 env steps"), strict.stderr
  assert _files_snapshot(run_dir) == before

  resumed = subprocess.run(resume, cwd=ROOT, text=True, capture_output=True, timeout=300)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  said = [line for line in resumed.stderr.splitlines() if line.startswith("[resume]")]
  assert len(said) == 1 and said[0].startswith(f"[resume] checkpoints/ckpt-000003 is damaged: {cut} has ") and \
      said[0].endswith("; set aside in checkpoints/damaged/, continuing from checkpoints/ckpt-000002 at 2000 env "
                       "steps: 1000 env steps lost (--resume_strict refuses instead)"), resumed.stderr
  assert "[resume] continuing from checkpoints/ckpt-000002 at 2000 env steps" in resumed.stdout.splitlines()
  assert os.path.isfile(os.path.join(run_dir, "checkpoints", "damaged", "ckpt-000003", cut))
  summary = json.load(open(os.path.join(run_dir, "summary.json")))
  assert summary["resumed"] and summary["actor_steps"] == 4_000
  assert summary["params_digest"] == reference["params_digest"]
  assert _metric_values(run_dir) == _metric_values(reference["run_dir"])  # the cut checkpoint's rows redone once
