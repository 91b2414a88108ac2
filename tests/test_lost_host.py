"""When a host dies: the launcher notices it by its heartbeat, names it and its nodes, goes on
without expendable nodes or stops the program and says how to resume, and never hangs on Slurm.

Each test gets a fresh 3-host Slurm cluster (scripts/slurm_test_cluster.sh: network namespaces
on this machine), because killing a host kills its slurmd too. "A host dies" is SIGKILL to every
process in its network namespace (slurmd, the job step, the host agent, its nodes), as a crashed
machine takes them all at once.
"""

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest
from conftest import needs_slurm
from test_multihost import _run_processes

pytestmark = [pytest.mark.needs_reverb, pytest.mark.slow, needs_slurm]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOSTS = "node1,node2,node3"
PLACEMENT = "replay,learner,counter,evaluator=node1 actor=node2,node3"
SMALL = ["--num_actors", "4", "--num_envs", "4", "--min_replay_size", "500", "--hidden_sizes", "32,32",
         "--eval_episodes", "2", "--progress_seconds", "2"]


class Launch:
  """`launch.train --distributed --launcher slurm` in the background, its output lines timestamped."""

  def __init__(self, args, env, cwd=ROOT):
    self.lines = []
    self.proc = subprocess.Popen([sys.executable, "-m", "launch.train", "--distributed", "--launcher", "slurm",
                                  "--hosts", HOSTS, *args], cwd=cwd, env=env, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    self._reader = threading.Thread(target=self._read, daemon=True)
    self._reader.start()

  def _read(self):
    for line in self.proc.stdout:
      self.lines.append((time.monotonic(), line.rstrip("\n")))

  def wait(self, timeout):
    self.proc.wait(timeout=timeout)
    self._reader.join(timeout=10)
    return self.proc.returncode, time.monotonic()

  def first(self, prefix):
    return next(((t, line) for t, line in self.lines if line.startswith(prefix)), (None, None))

  def text(self):
    return "\n".join(line for _, line in self.lines)[-5000:]


def _wait_for(condition, what, launch, timeout=300):
  deadline = time.monotonic() + timeout
  while not condition():
    assert launch.proc.poll() is None, f"the launch ended before {what}:\n{launch.text()}"
    assert time.monotonic() < deadline, f"no {what} within {timeout}s:\n{launch.text()}"
    time.sleep(0.5)


def _rows(path):
  return sum(1 for _ in open(path)) - 1 if os.path.exists(path) else 0


def _kill_host(index):
  """Host `index` dies at one instant, as a machine does: its network goes first (its link to the
  bridge down, so nothing it still sends gets out), then every process of its namespace is stopped
  and all are killed. Killed one by one with its network up, a dying process could still act: the
  batch script runs on node1 with the other hosts' `srun` clients, and a cancel sent to slurmctld as
  they died cancelled node2's and node3's steps, killing live hosts' agents (a host found lost
  beside node1: about one run in four here, and CI failures whose resume command named node3 alone)."""
  subprocess.run(["ip", "link", "set", f"vslurm{index}", "down"], check=True)
  out = subprocess.run(["ip", "netns", "pids", f"slurmns{index}"], capture_output=True, text=True, check=True)
  pids = list(map(int, out.stdout.split()))
  for how in (signal.SIGSTOP, signal.SIGKILL):
    for pid in pids:
      try:
        os.kill(pid, how)
      except ProcessLookupError:
        pass


def _no_process_left(run_dir, within=60):
  """No process of the run on any host, within `within` s: Slurm ends the cancelled job's batch
  script and its srun clients on the batch host after its KillWait (5 s in the test cluster)."""
  deadline = time.monotonic() + within
  while _run_processes(run_dir) and time.monotonic() < deadline:
    time.sleep(1)
  return _run_processes(run_dir) == []


# A host found lost by its deadline needs a budget that outlasts it after the kill; a run
# that ends sooner has the host found lost when the job ends (HostWatch.settle), which the
# agent-killed test below makes certain with a deadline no run of it reaches.


def test_an_actor_host_that_dies_is_named_and_the_run_finishes_without_it(slurm, tmp_path):
  run_dir = str(tmp_path / "lost-actors")
  # A deadline of 15 s: the two actors left finish the budget about 40 s after the kill here, and a
  # faster machine must not finish it before the deadline (the loss would be found at the end).
  launch = Launch(["--placement", PLACEMENT, "--steps", "30000", "--eval_every", "10000", *SMALL,
                   "--host_deadline_seconds", "15", "--run_dir", run_dir], slurm)
  _wait_for(lambda: _rows(os.path.join(run_dir, "metrics", "actor1.csv")) >= 2, "rows of actor 1 (node3)", launch)
  killed = time.monotonic()
  _kill_host(3)
  code, ended = launch.wait(timeout=900)
  assert code == 0, launch.text()
  noticed, line = launch.first("[launch] host node3 lost")
  assert line is not None and noticed - killed <= 60, launch.text()
  assert "it ran actor/1, actor/3; the run goes on without them" in line, line
  summary = json.load(open(os.path.join(run_dir, "summary.json")))
  assert summary["details"]["lost_hosts"] == ["node3"] and summary["details"]["lost_nodes"] == ["actor/1", "actor/3"], summary
  assert summary["actor_steps"] >= 30000
  # The program ended when the evaluator stopped it (the stop file); the launcher returned soon after,
  # not when Slurm's own timeout marked node3 down (minutes).
  stopped = os.path.getmtime(os.path.join(run_dir, "launch", "STOP"))
  assert time.time() - (time.monotonic() - ended) - stopped <= 60, launch.text()
  assert "lost hosts node3 (nodes actor/1, actor/3)" in launch.lines[-1][1], launch.text()
  assert _no_process_left(run_dir), _run_processes(run_dir)


def test_the_learners_host_dies_the_program_stops_and_names_how_to_resume(slurm, tmp_path):
  run_dir = str(tmp_path / "lost-learner")
  # 12k env steps: the actors stall once replay is gone, so the first session cannot finish before
  # the host deadline; the resumed session runs the rest.
  launch = Launch(["--placement", PLACEMENT, "--steps", "12000", "--eval_every", "4000",
                   "--checkpoint_every_steps", "3000", *SMALL, "--run_dir", run_dir], slurm)
  _wait_for(lambda: os.path.isdir(os.path.join(run_dir, "checkpoints", "ckpt-000001")), "first checkpoint", launch)
  killed = time.monotonic()
  _kill_host(1)
  code, ended = launch.wait(timeout=600)
  assert code == 1 and ended - killed <= 90, (ended - killed, launch.text())
  error = launch.lines[-1][1]
  assert "host node1 lost" in error and "learner/0" in error and "cannot do without" in error, launch.text()
  assert "continue it on the other hosts with: python -m launch.train --resume" in error, error
  command = error.split("continue it on the other hosts with: ", 1)[1]
  assert "--hosts node2,node3" in command and "node1" not in command.split("--hosts", 1)[1], launch.text()
  # Once node2's and node3's agents ended, the launcher cancelled the job at once: only the lost host was left.
  assert any("has only its lost hosts (node1) left: cancelling it" in line for _, line in launch.lines), launch.text()
  assert _no_process_left(run_dir), _run_processes(run_dir)
  # The checkpoint it names is intact (verified by its manifest) for that command to continue from.
  from jrl.experiment.checkpoint import Checkpointer
  latest = Checkpointer(run_dir).latest()
  assert latest.path in error
  resumed_from = latest.manifest["counters"]["actor_steps"]
  # The command it printed, as a user would paste it, continues the run on node2 and node3.
  args = shlex.split(command)
  assert args[:3] == ["python", "-m", "launch.train"], command
  resume = subprocess.run([sys.executable, *args[1:]], cwd=ROOT, env=slurm, capture_output=True, text=True,
                          timeout=600)
  assert resume.returncode == 0, resume.stdout[-3000:] + resume.stderr[-3000:]
  summary = json.load(open(os.path.join(run_dir, "summary.json")))
  assert summary["resumed"] and summary["actor_steps"] >= 12000 > resumed_from, summary
  assert _no_process_left(run_dir), _run_processes(run_dir)


def test_a_host_agent_killed_alone_takes_its_nodes_with_it(slurm, tmp_path):
  run_dir = str(tmp_path / "agent-killed")
  launch = Launch(["--placement", PLACEMENT, "--steps", "20000", "--eval_every", "10000", *SMALL,
                   "--host_deadline_seconds", "900", "--run_dir", run_dir], slurm)
  _wait_for(lambda: _rows(os.path.join(run_dir, "metrics", "actor1.csv")) >= 2, "rows of actor 1 (node3)", launch)
  agent = next(p for p in _run_processes(run_dir)
               if "launch.host" in " ".join(p.cmdline()) and p.cmdline()[-1] == "node3")
  on_node3 = [p for p in _run_processes(run_dir) if p.environ().get("JRL_HOST") == "node3" and p.pid != agent.pid]
  assert len(on_node3) == 2, on_node3  # actors 1 and 3
  agent.kill()
  gone, alive = psutil.wait_procs(on_node3, timeout=10)
  assert not alive, alive
  code, _ = launch.wait(timeout=900)
  assert code == 0, launch.text()
  assert any(line.startswith("[launch] host node3 lost (its agent ended without its last heartbeat): it ran "
                             "actor/1, actor/3; the run finished without them") for _, line in launch.lines), launch.text()
  summary = json.load(open(os.path.join(run_dir, "summary.json")))
  assert summary["details"]["lost_hosts"] == ["node3"] and summary["actor_steps"] >= 20000, summary
  assert _no_process_left(run_dir), _run_processes(run_dir)
