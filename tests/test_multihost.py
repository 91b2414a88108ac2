"""One program across three hosts of a real Slurm cluster (network namespaces on this machine).

The cluster comes from scripts/slurm_test_cluster.sh (needs root, slurm-wlm and
munge; .ci/run installs them). Hosts node1..node3 are 10.200.0.1..3; the run
directory is on the filesystem they share.
"""

import csv
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

pytestmark = [pytest.mark.needs_reverb, pytest.mark.slow]  # real Launchpad programs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTER = os.path.join(ROOT, "scripts", "slurm_test_cluster.sh")
HOSTS = "node1,node2,node3"
PLACEMENT = "replay,learner,counter,evaluator=node1 learner,inference=node2 actor=node2,node3"

needs_cluster = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("slurmctld") is None or shutil.which("munged") is None,
    reason="needs root and Debian's slurm-wlm + munge (.ci/run installs them)")


@pytest.fixture(scope="module")
def slurm():
  # munged wants every folder above its socket searchable by all: not pytest's private tmp folders.
  state = tempfile.mkdtemp(prefix="jrl-slurm-")
  up = subprocess.run([CLUSTER, "up", state], capture_output=True, text=True, timeout=120)
  assert up.returncode == 0, up.stdout + up.stderr
  env = dict(os.environ, SLURM_CONF=os.path.join(state, "slurm.conf"))
  yield env
  down = subprocess.run([CLUSTER, "down", state], capture_output=True, text=True, timeout=120)
  assert down.returncode == 0, down.stderr
  netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
  assert "slurmns" not in netns, "the cluster was not torn down"
  shutil.rmtree(state, ignore_errors=True)


def _run_processes(run_dir):
  """Processes (in any namespace) that belong to the run: nodes carry JRL_RUN_DIR."""
  found = []
  for proc in psutil.process_iter(["pid", "cmdline"]):
    try:
      if proc.environ().get("JRL_RUN_DIR") == run_dir or run_dir in " ".join(proc.info["cmdline"] or []):
        found.append(proc)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
      pass
  return found


def _digests(log_path):
  """{learner version: params digest} from a learner node's log."""
  found = {}
  for line in open(log_path, errors="replace"):
    match = re.search(r"\[learner\] params_digest at version (\d+): ([0-9a-f]{64})", line)
    if match:
      found[int(match.group(1))] = match.group(2)
  return found


def _train(args, env, timeout=900, cwd=ROOT):
  return subprocess.run([sys.executable, "-m", "launch.train", "--distributed", *args], cwd=cwd, env=env, text=True,
                        capture_output=True, timeout=timeout)


# The three-host program: the same wiring checked on a short budget (slow tier, CI), and learning to
# the threshold (long tier, `make test-long`: a run of many minutes).
THREE_HOST_RUNS = [pytest.param(4_000, False, id="short"),
                   pytest.param(100_000, True, id="to-threshold", marks=pytest.mark.long)]


@needs_cluster
@pytest.mark.parametrize("steps, to_threshold", THREE_HOST_RUNS)
def test_dqn_spans_three_hosts_through_slurm_and_reaches_the_threshold(slurm, tmp_path, steps, to_threshold):
  # DQN's defaults (one update per env step), with exploration decayed over 10k env steps in
  # all as in an embedded run: epsilon counts each actor's own steps, and 4 actors at the
  # default 10k explored for 40k. Before, a run at 32 samples per insert (a quarter of the
  # updates) and 40k of exploration reached 475 at 67.5k env steps, and once not within 100k.
  run_dir = str(tmp_path / "three-hosts")
  start = time.monotonic()
  until = ["--stop_at_threshold"] if to_threshold else []
  out = _train(["--launcher", "slurm", "--hosts", HOSTS, "--placement", PLACEMENT, "--num_processes", "2",
                "--num_actors", "4", "--inference", "server", "--steps", str(steps), *until,
                "--epsilon_decay_steps", "2500",
                "--progress_seconds", "5", "--run_dir", run_dir], slurm)
  wall = time.monotonic() - start
  assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
  summary = json.load(open(os.path.join(run_dir, "summary.json")))
  if to_threshold:
    assert summary["steps_to_threshold"] is not None and summary["steps_to_threshold"] <= 100_000, summary
  else:
    assert summary["actor_steps"] >= steps, summary
  assert summary["learner_processes"] == 2
  # Actors 1 and 3 ran on node3 (actor=node2,node3 round-robin) and inserted items.
  for actor in (1, 3):
    rows = list(csv.DictReader(open(os.path.join(run_dir, "metrics", f"actor{actor}.csv"))))
    assert rows and rows[0]["host"] == "node3" and float(rows[-1]["items_inserted"]) > 0, rows[-1:]
  # Both learner processes made learner calls and ended with the same parameters: each logs
  # the digest of its parameters every 50 calls and at its end.
  digests = []
  for process in (0, 1):
    rows = list(csv.DictReader(open(os.path.join(run_dir, "metrics", f"learner{process}.csv"))))
    assert rows and float(rows[-1]["learner_steps"]) > 0 and rows[-1]["host"] == f"node{process + 1}"
    digests.append(_digests(os.path.join(run_dir, "logs", "learner", str(process))))
  common = sorted(set(digests[0]) & set(digests[1]))
  assert len(common) >= 5, common
  assert all(digests[0][v] == digests[1][v] for v in common)
  assert common[-1] >= max(max(digests[0]), max(digests[1])) - 50  # up to their last calls
  assert os.path.exists(os.path.join(run_dir, "launch", "job.sbatch"))
  assert _run_processes(run_dir) == []
  print(f"3-host program: {wall:.1f}s wall, {summary['actor_steps']} env steps")


@needs_cluster
def test_killing_an_actor_hosts_processes_is_survived_or_named(slurm, tmp_path):
  """SIGKILL every node process on node3 (its actors) mid-run: they are restarted and the
  job still ends with status 0; no process of the run is left on any host."""
  run_dir = str(tmp_path / "kill-host")
  proc = subprocess.Popen([sys.executable, "-m", "launch.train", "--distributed", "--launcher", "slurm",
                           "--hosts", HOSTS, "--placement", PLACEMENT, "--num_actors", "2", "--steps", "20000",
                           "--num_envs", "4", "--min_replay_size", "500", "--hidden_sizes", "32,32",
                           "--eval_every", "5000", "--eval_episodes", "2", "--run_dir", run_dir], cwd=ROOT, env=slurm,
                          text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  pid_file = os.path.join(run_dir, "logs", "pids", "actor-1")
  deadline = time.monotonic() + 300
  while time.monotonic() < deadline and proc.poll() is None:
    rows = glob.glob(os.path.join(run_dir, "metrics", "actor1.csv"))
    if rows and os.path.getsize(rows[0]) > 200 and os.path.exists(pid_file):
      break
    time.sleep(0.5)
  victim = int(open(pid_file).read())
  psutil.Process(victim).kill()
  out, err = proc.communicate(timeout=600)
  assert proc.returncode == 0, out[-3000:] + err[-3000:]
  summary = json.load(open(os.path.join(run_dir, "summary.json")))
  assert summary["details"]["restarts"].get("actor/1") == 1, summary
  assert _run_processes(run_dir) == []


@needs_cluster
def test_learner_processes_on_two_hosts_equal_one_process(slurm, tmp_path):
  """The sharding equality test across hosts: two learner processes on node1 and node2, joined
  by jax.distributed over the cluster network, equal the single-process learner fed the same batches."""
  import numpy as np
  from test_sharding import WORKER, _load
  env = dict(slurm, XLA_FLAGS="--xla_force_host_platform_device_count=1", PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
  single = tmp_path / "single.npz"
  subprocess.run([sys.executable, WORKER, str(single), "--devices", "1"], cwd=ROOT, env=env, check=True,
                 capture_output=True, timeout=300)
  out = tmp_path / "two-hosts.npz"
  address = "10.200.0.1:47611"
  procs = [subprocess.Popen(["srun", "-N1", "-n1", "-w", f"node{pid + 1}", sys.executable, WORKER, str(out),
                             "--coordinator", address, "--num_processes", "2", "--process_id", str(pid)],
                            cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
           for pid in (0, 1)]
  for proc in procs:
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output[-3000:]
  facts, leaves = _load(out)
  reference = _load(single)[1]
  assert facts["processes"] == 2 and facts["devices"] == 2
  for ours, theirs in zip(leaves, reference):
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


@needs_cluster
def test_a_launch_whose_sbatch_failed_does_not_block_the_same_command(slurm, tmp_path):
  """sbatch refuses the first launch (a Slurm configuration it cannot read); the run folder it
  left holds no checkpoint, so the same command, once Slurm works, starts it over and runs."""
  # Addresses given, so that nothing asks Slurm before sbatch does (scontrol would refuse the config first).
  hosts = "node1=10.200.0.1,node2=10.200.0.2,node3=10.200.0.3"
  command = ["--launcher", "slurm", "--hosts", hosts, "--placement", PLACEMENT, "--num_actors", "2",
             "--steps", "3000", "--num_envs", "4", "--min_replay_size", "500", "--hidden_sizes", "32,32",
             "--eval_every", "3000", "--eval_episodes", "2", "--run_dir", "rel/slurm"]
  broken = tmp_path / "broken-slurm.conf"
  broken.write_text("")
  out = _train(command, dict(slurm, SLURM_CONF=str(broken)), cwd=tmp_path)
  run_dir = str(tmp_path / "rel" / "slurm")
  assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
  assert "error: sbatch refused" in out.stderr and os.path.isfile(os.path.join(run_dir, "config.json"))
  out = _train(command, slurm, cwd=tmp_path)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  assert f"[run] {run_dir} holds a run that stopped before its first checkpoint: starting it over" in out.stdout
  assert json.load(open(os.path.join(run_dir, "summary.json")))["actor_steps"] >= 3000
  assert _run_processes(run_dir) == []


@needs_cluster
def test_slurm_launch_example_runs_on_the_cluster(slurm, tmp_path):
  run_dir = str(tmp_path / "example")
  out = subprocess.run(["bash", "examples/slurm_launch.sh", run_dir, "--steps", "3000", "--num_envs", "4",
                        "--min_replay_size", "500", "--hidden_sizes", "32,32", "--eval_every", "3000",
                        "--eval_episodes", "2"], cwd=ROOT, env=slurm, capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  summary = json.load(open(os.path.join(run_dir, "summary.json")))
  assert summary["actor_steps"] >= 3000 and summary["details"]["inference"] == "server"
  hosts = {row["host"] for path in glob.glob(os.path.join(run_dir, "metrics", "actor*.csv"))
           for row in csv.DictReader(open(path))}
  assert hosts == {"node2", "node3"}, hosts
  assert _run_processes(run_dir) == []
