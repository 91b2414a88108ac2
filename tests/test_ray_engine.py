"""The distributed program on Ray (`--engine ray`, the core stack's engine): the same nodes as on
Launchpad, each in a Ray actor; placement by role; a killed actor restarted by Ray; a stop from outside
checkpointed first; every agent reaching its README threshold (long tier). Real Ray clusters started by
the run or by `ray start`, real gymnasium envs, jrl's ReplayServer."""

import csv
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

from conftest import holding_test_hosts
from jrl.accelerators import ray_gpus
from jrl.errors import ConfigError
from jrl.experiment.summary import KEYS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ["--min_replay_size", "500", "--eval_episodes", "2", "--hidden_sizes", "32,32", "--num_envs", "4",
         "--progress_seconds", "1"]
# What a distributed run's summary details hold, whichever engine ran it: the driver node's, then the
# launcher's (tests/test_distributed.py holds the Launchpad program's to the same).
PROGRAM_DETAILS = {"inference", "num_actors", "engine", "final_checkpoint", "inference_batch_mean", "policy_lag_mean",
                   "learner_version", "replay_size", "replay_items_inserted", "replay_items_sampled", "restarts",
                   "restarts_total", "lost_hosts", "lost_nodes", "devices"}


def test_ray_gpus_places_learners_and_servers_as_one_host_does():
  assert ray_gpus(0, learner_devices=0, learners=2, inference_servers=1) == {"learner": (0.0, 0.0), "inference": (0.0,)}
  # Two GPUs, one server: the learner all but the server's (1), the server the other.
  assert ray_gpus(2, inference_servers=1) == {"learner": (1.0,), "inference": (1.0,)}
  # No server: the learner takes both; two learner processes one each.
  assert ray_gpus(2) == {"learner": (2.0,), "inference": ()}
  assert ray_gpus(2, learners=2) == {"learner": (1.0, 1.0), "inference": ()}
  # Four GPUs, --learner_devices 2, two servers: one each for the servers.
  assert ray_gpus(4, learner_devices=2, inference_servers=2) == {"learner": (2.0,), "inference": (1.0, 1.0)}
  # One GPU, a server: the learner has it; the server none is left for (it acts on the CPU).
  assert ray_gpus(1, inference_servers=1) == {"learner": (1.0,), "inference": (0.0,)}
  with pytest.raises(ConfigError, match="learner_devices"):
    ray_gpus(2, learner_devices=3)
  with pytest.raises(ConfigError, match="num_processes"):
    ray_gpus(2, learners=3)


# Ray 2.60's `ray start` and its joining nodes with token authentication, as a user sets it for a cluster
# (the token in ~/.ray/auth_token, made by the first `ray start --head`); launch.train joining with
# --ray_address turns it on itself where a token is at hand.
RAY_TOKEN_ENV = {**os.environ, "RAY_AUTH_MODE": "token"}


ON_RAY = [sys.executable, "-m", "launch.train", "--distributed", "--engine", "ray"]


def _train(args, timeout=600, env=None, **kwargs):
  return subprocess.run([*ON_RAY, *args], cwd=ROOT, text=True, capture_output=True, timeout=timeout, env=env,
                        **kwargs)


def _launch(args):
  """A run on Ray left running (to be killed or stopped), its output piped."""
  return subprocess.Popen([*ON_RAY, *SMALL, "--num_actors", "2", *args], cwd=ROOT, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _summary(run_dir):
  with open(os.path.join(run_dir, "summary.json")) as f:
    return json.load(f)


@pytest.mark.slow
@pytest.mark.needs_ray
def test_a_program_on_ray_runs_every_node_and_writes_the_launchpad_programs_summary(tmp_path):
  run_dir = str(tmp_path / "ray")
  out = _train([*SMALL, "--agent", "dqn", "--num_actors", "2", "--inference", "server", "--steps", "3000",
                "--eval_every", "1500", "--run_dir", run_dir])
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  summary = _summary(run_dir)
  assert tuple(summary) == KEYS and summary["kind"] == "distributed" and summary["replay"] == "served"
  assert summary["stack"] == "core" and summary["actor_steps"] >= 3000 and summary["learner_steps"] > 0
  details = summary["details"]
  assert set(details) == PROGRAM_DETAILS | {"inference_batch_sizes"}, sorted(set(details) ^ PROGRAM_DETAILS)
  assert details["engine"] == "ray" and details["inference"] == "server" and details["inference_batch_mean"] > 1.0
  assert details["replay_items_inserted"] > 0 and details["replay_items_sampled"] > 0
  assert details["restarts_total"] == 0 and details["devices"]["actor"] == ["cpu", "cpu"]
  assert summary["bottleneck"] and os.path.isfile(os.path.join(run_dir, "report.md"))
  # The Launchpad layout: each node's log, its pid; Ray's own logs in the run too, none on the terminal.
  for node in ("counter/0", "replay/0", "learner/0", "inference/0", "actor/0", "actor/1", "evaluator/0"):
    assert os.path.isfile(os.path.join(run_dir, "logs", node)), node
  assert os.path.isfile(os.path.join(run_dir, "logs", "ray", "raylet.out"))
  assert "(raylet)" not in out.stderr and "core_worker" not in out.stderr, out.stderr[-3000:]
  progress = [line for line in out.stdout.splitlines() if "] steps " in line]
  assert progress and out.stdout.strip().splitlines()[-1].startswith("done: 3")


def _wait_for(path_fn, timeout=300):
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    found = path_fn()
    if found:
      return found
    time.sleep(0.2)
  raise AssertionError("timed out")


def _actor_steps(run_dir, actor):
  path = os.path.join(run_dir, "metrics", f"actor{actor}.csv")
  if not os.path.exists(path):
    return 0
  with open(path) as f:
    rows = list(csv.DictReader(f))
  return float(rows[-1]["actor_steps"]) if rows else 0


@pytest.mark.slow
@pytest.mark.needs_ray
def test_an_actor_killed_with_sigkill_is_restarted_by_ray_and_named_in_the_summary(tmp_path):
  run_dir = str(tmp_path / "killed")
  launch = _launch(["--steps", "6000", "--eval_every", "3000", "--run_dir", run_dir])
  _wait_for(lambda: _actor_steps(run_dir, 0) > 200)
  with open(os.path.join(run_dir, "logs", "pids", "actor-0")) as f:
    victim = int(f.read())
  os.kill(victim, signal.SIGKILL)
  out, err = launch.communicate(timeout=600)
  assert launch.returncode == 0, out[-3000:] + err[-3000:]
  summary = _summary(run_dir)
  assert summary["actor_steps"] >= 6000
  assert summary["details"]["restarts"] == {"actor/0": 1} and summary["details"]["restarts_total"] == 1
  with open(os.path.join(run_dir, "logs", "pids", "actor-0")) as f:
    assert int(f.read()) != victim  # a new process
  with open(os.path.join(run_dir, "logs", "actor", "0")) as f:
    assert "===== actor/0 restarted (incarnation 1) =====" in f.read()


@pytest.mark.slow
@pytest.mark.needs_ray
def test_two_gpus_declared_on_a_cpu_machine_go_to_the_learner_and_the_server_and_none_to_actors(tmp_path):
  """`ray start --head --num-gpus 2` on this CPU machine, joined with --ray_address: Ray gives the
  learner and the inference server a GPU each (their CUDA_VISIBLE_DEVICES), the actors and the rest none
  (JAX confined to the CPU there). JAX's CPU wheels see no GPU, so the run itself is on the CPU."""
  temp = tempfile.mkdtemp(prefix="jrl-rayhead-")
  port = str(__import__("portpicker").pick_unused_port())
  ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
  # On 127.0.0.2: Ray takes a 127.0.0.1 address for the machine's outside one (launch/ray_program.py).
  start = subprocess.run([ray_bin, "start", "--head", "--num-gpus", "2", "--num-cpus", "8", "--port", port,
                          "--node-ip-address", "127.0.0.2", "--temp-dir", temp, "--include-dashboard", "false",
                          "--disable-usage-stats"], capture_output=True, text=True, timeout=120, env=RAY_TOKEN_ENV)
  assert start.returncode == 0, start.stdout + start.stderr
  try:
    run_dir = str(tmp_path / "gpus")
    out = _train([*SMALL, "--num_actors", "2", "--inference", "server", "--steps", "2000", "--eval_every", "2000",
                  "--ray_address", f"127.0.0.2:{port}", "--run_dir", run_dir])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    devices = _summary(run_dir)["details"]["devices"]
    assert sorted(devices["learner"] + devices["inference"]) == ["cuda:0", "cuda:1"], devices
    assert devices["actor"] == ["cpu", "cpu"] and devices["evaluator"] == ["cpu"], devices
    assert devices["counter"] == devices["replay"] == ["cpu"], devices
  finally:
    _kill_processes_naming(temp)


def _kill_processes_naming(folder):
  """Ends the Ray started under FOLDER (its GCS, raylet and workers name it in their arguments), and no
  other: `ray stop` would end every Ray on the machine, another test's too."""
  for proc in psutil.process_iter(["cmdline"]):
    if folder in " ".join(proc.info["cmdline"] or []) and proc.pid != os.getpid():
      try:
        proc.kill()
      except psutil.Error:  # ended meanwhile
        pass


@pytest.mark.slow
@pytest.mark.needs_ray
def test_sigterm_has_the_learner_checkpoint_first_and_resume_continues(tmp_path):
  run_dir = str(tmp_path / "stopped")
  launch = _launch(["--steps", "100000", "--eval_every", "5000", "--run_dir", run_dir])
  _wait_for(lambda: _actor_steps(run_dir, 0) > 700)
  launch.send_signal(signal.SIGTERM)
  out, err = launch.communicate(timeout=300)
  assert launch.returncode == 143, out[-3000:] + err[-3000:]
  assert "[launcher] checkpoint checkpoints/ckpt-" in out, out[-3000:]
  last = err.strip().splitlines()[-1]
  assert last.startswith("python -m launch.train: interrupted (SIGTERM)") and "--resume" in last, last
  resumed = subprocess.run([sys.executable, "-m", "launch.train", "--resume", run_dir, "--steps", "4000"], cwd=ROOT,
                           text=True, capture_output=True, timeout=600)
  assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
  summary = _summary(run_dir)
  assert summary["resumed"] and summary["actor_steps"] >= 4000 and summary["details"]["engine"] == "ray"


# Each agent's README threshold on Ray, the inference as the issue sets it (long tier: minutes each).
AGENT_RUNS = [
    ("dqn", "CartPole-v1", "server", 100_000, None),
    ("ppo", "CartPole-v1", "server", 200_000, None),
    ("impala", "CartPole-v1", "server", 400_000, None),
    ("r2d2", "jrl/MaskedCartPole-v1", "server", 400_000, "400"),
    ("sac", "Pendulum-v1", "actor", 40_000, "-200"),
]


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.needs_ray
@pytest.mark.parametrize("agent, env, inference, steps, threshold", AGENT_RUNS, ids=[a[0] for a in AGENT_RUNS])
def test_every_agent_reaches_its_readme_threshold_on_ray(tmp_path, agent, env, inference, steps, threshold):
  run_dir = str(tmp_path / agent)
  extra = ["--reward_threshold", threshold] if threshold else []
  out = _train(["--agent", agent, "--env", env, "--num_actors", "2", "--inference", inference, "--steps", str(steps),
                "--stop_at_threshold", "--progress_seconds", "10", *extra, "--run_dir", run_dir], timeout=3600)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  summary = _summary(run_dir)
  assert tuple(summary) == KEYS and set(summary["details"]) >= PROGRAM_DETAILS
  assert summary["steps_to_threshold"] is not None, (summary["best_eval_return"], summary["actor_steps"])
  print(f"{agent} on Ray: {summary['steps_to_threshold']} env steps to the threshold, {summary['wall_seconds']} s")


CLUSTER = os.path.join(ROOT, "scripts", "slurm_test_cluster.sh")
needs_hosts = pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/sbin/ip") and not os.path.exists(
    "/sbin/ip"), reason="needs root and iproute2 (network namespaces for the test hosts)")


@pytest.fixture
def two_ray_hosts(tmp_path):
  """A Ray cluster of two of the project's test hosts (network namespaces, scripts/slurm_test_cluster.sh
  hosts): its head on node1 (10.200.0.1, no CPUs of its own to give), a worker on node2 (10.200.0.2,
  two CPUs: the actors'). Yields (address, start_worker, in_host): the worker can be started again."""
  with holding_test_hosts():  # the test hosts are one set per machine
    state = tempfile.mkdtemp(prefix="jrl-rayhosts-")
    up = subprocess.run([CLUSTER, "hosts", state], capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stdout + up.stderr
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    port = "6390"  # on the test hosts' own addresses: no other service listens there

    def in_host(i, command):
      return ["nsenter", f"--net=/run/netns/slurmns{i}", *command]

    def start(i, *args):
      out = subprocess.run(in_host(i, [ray_bin, "start", "--node-ip-address", f"10.200.0.{i}", "--disable-usage-stats",
                                       "--temp-dir", os.path.join(state, f"ray{i}"), *args]),
                           capture_output=True, text=True, timeout=180, env=RAY_TOKEN_ENV)
      assert out.returncode == 0, out.stdout + out.stderr

    try:
      start(1, "--head", "--port", port, "--num-cpus", "0", "--include-dashboard", "false")
      start_worker = lambda: start(2, "--address", f"10.200.0.1:{port}", "--num-cpus", "2")  # noqa: E731
      start_worker()
      yield f"10.200.0.1:{port}", start_worker, in_host
    finally:
      down = subprocess.run([CLUSTER, "down", state], capture_output=True, text=True, timeout=180)
      assert down.returncode == 0, down.stderr


@pytest.mark.slow
@pytest.mark.needs_ray
@needs_hosts
def test_a_program_over_two_ray_hosts_names_the_lost_one_and_resumes_from_its_checkpoint(two_ray_hosts, tmp_path):
  address, start_worker, in_host = two_ray_hosts
  run_dir = str(tmp_path / "two-hosts")
  launch = subprocess.Popen(in_host(1, [*ON_RAY, *SMALL, "--num_actors", "2", "--steps", "100000", "--eval_every",
                                        "5000", "--checkpoint_every_steps", "1000", "--ray_address", address,
                                        "--run_dir", run_dir]),
                            cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  _wait_for(lambda: os.path.isdir(os.path.join(run_dir, "checkpoints")) and any(
      name.startswith("ckpt-") for name in os.listdir(os.path.join(run_dir, "checkpoints"))), timeout=400)
  # The actors ran on node2 (the head gives no CPUs), the rest on node1.
  with open(os.path.join(run_dir, "metrics", "actor0.csv")) as f:
    assert {row["host"] for row in csv.DictReader(f)} == {"10.200.0.2"}
  with open(os.path.join(run_dir, "metrics", "learner.csv")) as f:
    assert {row["host"] for row in csv.DictReader(f)} == {"10.200.0.1"}
  pids = subprocess.run(["ip", "netns", "pids", "slurmns2"], capture_output=True, text=True).stdout.split()
  for pid in pids:  # node2 dies: its raylet, its actors, everything in it
    try:
      os.kill(int(pid), signal.SIGKILL)
    except ProcessLookupError:
      pass
  out, err = launch.communicate(timeout=300)
  assert launch.returncode == 1, out[-3000:] + err[-3000:]
  last = err.strip().splitlines()[-1]
  assert last.startswith("python -m launch.train: error: host 10.200.0.2 lost (its Ray node died) with nodes "
                         "actor/0, actor/1; the program stopped."), last
  assert last.endswith(f"continue it with: python -m launch.train --resume {run_dir}"), last
  from jrl.experiment.checkpoint import Checkpointer
  kept = int(Checkpointer(run_dir).latest().manifest["counters"]["actor_steps"])
  start_worker()
  budget = str(kept + 2000)
  resumed = subprocess.run(in_host(1, [sys.executable, "-m", "launch.train", "--resume", run_dir, "--steps", budget]),
                           cwd=ROOT, text=True, capture_output=True, timeout=600)
  assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
  summary = _summary(run_dir)
  assert summary["resumed"] and summary["actor_steps"] >= kept + 2000 and summary["details"]["lost_hosts"] == []
