"""The commands as a user types them: runs, resumes, evaluations and sweeps given relative folders
from another working directory (`make train` itself, from the repository root, is run with the
README's other commands in tests/test_readme.py). Other tests pass an absolute temporary folder;
these and the README's commands are the ones that caught `make train` crashing at its final
checkpoint (orbax refuses relative paths)."""

import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.needs_reverb, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHORT = ["--steps", "1600", "--eval_every", "1600", "--eval_episodes", "2", "--progress_seconds", "0"]


def _run(module, *args, cwd, timeout=300):
  return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True,
                        timeout=timeout)


def _finished(run_dir):
  summary = json.load(open(os.path.join(run_dir, "summary.json")))
  assert os.path.isfile(os.path.join(run_dir, "report.md"))
  assert glob.glob(os.path.join(run_dir, "plots", "*.png"))
  return summary


@pytest.mark.parametrize("replay", ["reverb", "deterministic"])
def test_relative_run_dir_through_final_checkpoint_resume_and_evaluate(tmp_path, replay):
  extra = ["--deterministic"] if replay == "deterministic" else []
  out = _run("launch.train", "--run_dir", "rel/run", "--checkpoint_every_steps", "1000", *SHORT, *extra,
             cwd=tmp_path)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  run_dir = str(tmp_path / "rel" / "run")
  summary = _finished(run_dir)
  assert summary["checkpoints"] == ["ckpt-000001", "ckpt-000002"]
  config = json.load(open(os.path.join(run_dir, "config.json")))
  assert config["experiment"]["run_dir"] == run_dir  # resolved once, against the working directory

  out = _run("launch.train", "--resume", "rel/run", "--steps", "2400", cwd=tmp_path)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  summary = _finished(run_dir)
  assert summary["resumed"] and summary["actor_steps"] == 2400
  assert summary["checkpoints"] == ["ckpt-000002", "ckpt-000003", "ckpt-000004"]  # at 2000 and at its end

  out = _run("launch.evaluate", "rel/run", "--which", "final", "--episodes", "2", cwd=tmp_path)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.startswith("final policy of rel/run: actor_steps 2400")
  if replay == "reverb":  # and a video of it, to a relative file: inside the run, not in the working directory
    out = _run("launch.evaluate", "rel/run", "--episodes", "1", "--video", "videos/best.mp4", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "video: rel/run/videos/best.mp4 (1 episodes" in out.stdout
    assert (tmp_path / "rel" / "run" / "videos" / "best.mp4").stat().st_size > 1000
    assert sorted(os.listdir(tmp_path)) == ["rel"] and sorted(os.listdir(tmp_path / "rel")) == ["run"]


def test_relative_sweep_folder_runs_every_seed_and_reports(tmp_path):
  out = _run("launch.sweep", "--seeds", "0-1", "--run_dir", "rel/sweep", "--deterministic", *SHORT,
             cwd=tmp_path, timeout=600)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  assert "2/2 seeds finished" in out.stdout
  sweep = tmp_path / "rel" / "sweep"
  for seed in (0, 1):
    _finished(str(sweep / f"dqn-CartPole-v1-s{seed}"))
  assert (sweep / "report.md").is_file()
  out = _run("launch.report", "rel/sweep", cwd=tmp_path)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "dqn on CartPole-v1: 2 runs" in out.stdout


def test_a_failed_checkpoint_keeps_the_finished_run(tmp_path):
  """`checkpoints` is a file, not a folder: every checkpoint write fails (as root too, unlike a
  read-only folder). The run trains to its end, writes its summary, plot and report, names the
  checkpoint in one line and exits 1, without an abort."""
  (tmp_path / "rel" / "run").mkdir(parents=True)
  (tmp_path / "rel" / "run" / "checkpoints").write_text("not a folder\n")
  out = _run("launch.train", "--run_dir", "rel/run", "--deterministic", *SHORT, cwd=tmp_path)
  assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
  run_dir = str(tmp_path / "rel" / "run")
  summary = _finished(run_dir)
  assert summary["actor_steps"] == 1600 and summary["checkpoints"] == []
  ckpt = os.path.join(run_dir, "checkpoints", "ckpt-000001")
  assert len(summary["failed_writes"]) == 1, summary["failed_writes"]
  assert summary["failed_writes"][0].startswith(f"checkpoint {ckpt} was not written (FileExistsError: ")
  failed = [line for line in out.stderr.splitlines() if line.startswith("[checkpoint]")]
  assert failed == [f"[checkpoint] {summary['failed_writes'][0]}"], out.stderr[-3000:]
  last = out.stderr.strip().splitlines()[-1]
  assert last.startswith("python -m launch.train: error: the run finished and wrote its summary in "
                         f"{run_dir}, but checkpoint {ckpt} was not written"), last
  assert "Traceback" not in out.stderr and "terminate called" not in out.stderr
  # The snapshots (policies/) are not under checkpoints/: they were written.
  assert sorted(os.listdir(os.path.join(run_dir, "policies"))) == [
      "best.json", "best.msgpack", "final.json", "final.msgpack"]


def _start_and_kill_before_first_checkpoint(command, cwd, run_dir):
  process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.monotonic() + 120
  while not os.path.isfile(os.path.join(run_dir, "config.json")):
    assert process.poll() is None and time.monotonic() < deadline, "the run ended before it was killed"
    time.sleep(0.05)
  process.send_signal(signal.SIGKILL)
  process.wait()
  assert not glob.glob(os.path.join(run_dir, "checkpoints", "ckpt-*"))


@pytest.mark.parametrize("again", ["same command", "resume"])
def test_a_run_killed_before_its_first_checkpoint_does_not_block_the_next(tmp_path, again):
  command = [sys.executable, "-m", "launch.train", "--run_dir", "rel/run", "--deterministic", *SHORT]
  run_dir = str(tmp_path / "rel" / "run")
  _start_and_kill_before_first_checkpoint(command, tmp_path, run_dir)
  rerun = command if again == "same command" else [sys.executable, "-m", "launch.train", "--resume", "rel/run"]
  out = subprocess.run(rerun, cwd=tmp_path, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  said = {"same command": f"[run] {run_dir} holds a run that stopped before its first checkpoint: "
                          "starting it over",
          "resume": f"[resume] {run_dir} has no checkpoint yet: the run starts over"}[again]
  assert said in out.stdout.splitlines(), out.stdout[-3000:]
  assert _finished(run_dir)["actor_steps"] == 1600
