"""A device run over several processes (`launch.device_hosts`): one loop over the devices of all,
joined by jax.distributed; placed by the host launchers; a killed process named; resumed.

The fast tier checks the placement and refusals; the slow tier runs two processes through the
template launcher on this machine, and two hosts of the real Slurm test cluster.
"""

import json
import os
import shlex
import subprocess
import sys
import time

import psutil
import pytest

pytestmark = pytest.mark.needs_reverb  # launch.cluster imports Launchpad

from jrl.errors import ConfigError  # noqa: E402
from jrl.experiment.config import ExperimentConfig  # noqa: E402
from conftest import needs_slurm  # noqa: E402
from launch import device_hosts  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PPO = ["--agent", "ppo", "--backend", "device", "--env", "gymnax:CartPole-v1", "--num_envs", "8",
       "--eval_every", "10000", "--progress_seconds", "5"]
LOOPBACK = ["--launcher", "template", "--hosts", "a=127.0.0.1,b=127.0.0.1", "--host_command", "{command}"]


def _exp(**fields):
  return ExperimentConfig(backend="device", env="gymnax:CartPole-v1", launcher="template", host_command="{command}",
                          **fields)


def test_processes_go_one_per_placed_host_and_continue_the_run_directory():
  placement = device_hosts.device_placement(_exp(hosts="a=10.0.0.1,b=10.0.0.2,c=10.0.0.3", placement="device=a,c"))
  assert [h.name for h in placement.hosts] == ["a", "c"] and placement.groups == {"device": ("a", "c")}
  every = device_hosts.device_placement(_exp(hosts="a=10.0.0.1,b=10.0.0.2"))
  assert [h.address for h in every.hosts] == ["10.0.0.1", "10.0.0.2"]
  command = device_hosts.process_command("/runs/x", _exp(hosts="a=10.0.0.1", steps=5000), 1, "10.0.0.1:1234")
  assert command[1:9] == ["-m", "launch.train", "--resume", "/runs/x", "--process_id", "1", "--coordinator_address",
                          "10.0.0.1:1234"], command
  assert command[command.index("--steps") + 1] == "5000" and "--stop_at_threshold" not in command
  assert "--resume_strict" not in command  # each process resumes as the launch was asked to
  assert "--resume_strict" in device_hosts.process_command("/runs/x", _exp(hosts="a=10.0.0.1", resume_strict=True),
                                                            1, "10.0.0.1:1234")
  for placement, message in (("actor=a", "placement: group 'device' is not placed on any host"),
                             ("device=a actor=b", "placement: a device run places only its processes"),
                             ("device=a,a", "placement: a device run takes one process per host"),
                             ("device=z", "placement: host 'z' is not in --hosts")):
    with pytest.raises(ConfigError) as error:
      device_hosts.device_placement(_exp(hosts="a=10.0.0.1,b=10.0.0.2", placement=placement))
    assert str(error.value).startswith(message), (placement, str(error.value))


@pytest.mark.parametrize("flags, message", [
    (["--num_processes", "3"], "num_processes: a device run over hosts has one process per host (2 placed), got 3"),
    (["--num_envs", "9"], "num_envs: must be divisible by the 2 processes, got 9"),
    (["--distributed"], "backend: 'device' is one compiled loop, not a Launchpad program"),
])
def test_bad_input_to_a_device_run_over_hosts_is_one_line_exit_2_and_nothing_written(tmp_path, flags, message):
  run_dir = tmp_path / "run"
  done = subprocess.run([sys.executable, "-m", "launch.train", *PPO, *LOOPBACK, *flags, "--run_dir", str(run_dir)],
                        cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert done.returncode == 2, done.stdout + done.stderr
  assert done.stderr.strip().splitlines()[-1].startswith(f"python -m launch.train: error: {message}"), done.stderr
  assert not run_dir.exists()


def _summary(run_dir):
  with open(os.path.join(run_dir, "summary.json")) as f:
    return json.load(f)


def _process(run_dir, index):
  """The process of device process `index` of the run (its command names the run and its index)."""
  for proc in psutil.process_iter(["cmdline"]):
    cmd = proc.info["cmdline"] or []
    if "launch.train" in cmd and run_dir in cmd and "--process_id" in cmd and \
        cmd[cmd.index("--process_id") + 1] == str(index):
      return proc
  return None


def _kill_after_first_checkpoint(launch, run_dir, index, timeout=400, seen=None):
  """SIGKILL to device process `index` once the run has a checkpoint; (exit status, output) of
  the launch. `seen` gets the host the process ran on."""
  deadline = time.monotonic() + timeout
  while not os.path.isdir(os.path.join(run_dir, "checkpoints", "ckpt-000001")):
    assert launch.poll() is None, launch.communicate()[0][-3000:]
    assert time.monotonic() < deadline, "no checkpoint"
    time.sleep(0.5)
  victim = _process(run_dir, index)
  assert victim is not None
  if seen is not None:
    seen["host"] = victim.environ().get("JRL_HOST")
  victim.kill()
  out, _ = launch.communicate(timeout=300)
  return launch.returncode, out


@pytest.mark.slow
def test_two_processes_killed_one_named_resumed_to_the_bytes_of_one_process_with_two_devices(tmp_path):
  """Two processes through the template launcher on this machine; process 1 is killed after the
  first checkpoint: the launch fails naming it and the command that continues; that command
  ends the run with the parameters of one process with two devices that was never stopped."""
  run_dir = str(tmp_path / "two")
  budget = ["--steps", "30000", "--checkpoint_every_steps", "10000"]
  launch = subprocess.Popen([sys.executable, "-m", "launch.train", *PPO, *LOOPBACK, *budget, "--run_dir", run_dir],
                            cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  code, out = _kill_after_first_checkpoint(launch, run_dir, 1)
  assert code == 1, out[-3000:]
  error = out.strip().splitlines()
  assert "on host b: node device/1 failed (killed by SIGKILL)" in out, out[-3000:]
  assert error[-1].startswith(f"The run's last checkpoint is {run_dir}/checkpoints/ckpt-"), error[-1]
  command = error[-1].split("continue it with: ", 1)[1]
  assert command == f"python -m launch.train --resume {run_dir} --hosts a=127.0.0.1,b=127.0.0.1", command
  resumed = subprocess.run([sys.executable, *shlex.split(command)[1:]], cwd=ROOT, capture_output=True, text=True,
                           timeout=600)
  assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
  assert "(every process)" in resumed.stdout.strip().splitlines()[-1], resumed.stdout[-2000:]
  one_dir = str(tmp_path / "one")
  one = subprocess.run([sys.executable, "-m", "launch.train", *PPO, *budget, "--run_dir", one_dir], cwd=ROOT,
                       capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2"))
  assert one.returncode == 0, one.stdout[-3000:] + one.stderr[-3000:]
  two, single = _summary(run_dir), _summary(one_dir)
  assert two["resumed"] and two["learner_processes"] == 2 and single["learner_devices"] == two["learner_devices"] == 2
  assert two["params_digest"] == single["params_digest"] and two["actor_steps"] == single["actor_steps"]
  follower = _summary(os.path.join(run_dir, "processes", "p1"))
  assert follower["params_digest"] == two["params_digest"]
  assert not os.path.exists(os.path.join(run_dir, "processes", "p1", "checkpoints", "ckpt-000001"))


@pytest.mark.slow
@needs_slurm
def test_device_ppo_over_two_slurm_hosts_survives_a_kill_by_resume_and_reaches_475(slurm, tmp_path):
  """On the 3-host Slurm test cluster: device PPO with a process on node1 and one on node2;
  kill -9 of node2's process ends the job non-zero naming it; the printed command continues
  from the last checkpoint to 475, and both processes end with the same parameter digest."""
  run_dir = str(tmp_path / "slurm-device")
  launch = subprocess.Popen([sys.executable, "-m", "launch.train", *PPO, "--launcher", "slurm", "--hosts",
                             "node1,node2,node3", "--placement", "device=node1,node2", "--steps", "150000",
                             "--checkpoint_every_steps", "10000", "--run_dir", run_dir], cwd=ROOT, env=slurm,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  victim = {}
  code, out = _kill_after_first_checkpoint(launch, run_dir, 1, seen=victim)
  assert victim["host"] == "node2", victim
  assert code == 1, out[-3000:]
  assert "on host node2: node device/1 failed (killed by SIGKILL)" in out, out[-3000:]
  command = out.strip().splitlines()[-1].split("continue it with: ", 1)[1]
  assert command == f"python -m launch.train --resume {run_dir} --hosts node1,node2", command
  resumed = subprocess.run([sys.executable, *shlex.split(command)[1:], "--stop_at_threshold"], cwd=ROOT, env=slurm,
                           capture_output=True, text=True, timeout=900)
  assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
  summary = _summary(run_dir)
  assert summary["resumed"] and summary["learner_processes"] == 2, summary
  assert summary["best_eval_return"] >= 475 and summary["steps_to_threshold"] is not None, summary
  digests = device_hosts.process_digests(run_dir, 2)
  assert digests[0] and digests == [summary["params_digest"]] * 2, digests
  assert resumed.stdout.strip().splitlines()[-1].startswith("done: ") and "(every process)" in resumed.stdout
