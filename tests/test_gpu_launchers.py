"""GPUs on the multi-host launchers (launch.cluster, jrl.run.distributed.multihost): what Slurm is asked for, the
template's {gpus}, and the devices each node starts with, as pure functions (this host has no GPU and
the Slurm test cluster none either; tests/test_multihost.py runs the real cluster, asked for none)."""

import shlex
import sys

import pytest

from jrl.accelerators import CPU_ONLY_ENV
from jrl.errors import ConfigError
from jrl.experiment.config import ExperimentConfig
from launch import cluster
from jrl.run.distributed import multihost
from jrl.run.distributed.placement import Host, parse_placement

pytestmark = pytest.mark.needs_reverb  # launch.cluster and jrl.run.distributed.multihost import launchpad

HOSTS = (Host("node1", "10.0.0.1"), Host("node2", "10.0.0.2"), Host("node3", "10.0.0.3"))
PLACEMENT = "replay,counter,evaluator=node1 learner,inference=node2 actor=node3"


def _exp(**changes):
  fields = dict(distributed=True, launcher="slurm", hosts="node1,node2,node3", num_actors=4, inference="server",
                num_inference_servers=2, learner_devices=2)
  fields.update(changes)
  return ExperimentConfig(**fields)


def _placement(exp, text=PLACEMENT):
  return parse_placement(text, HOSTS, cluster.group_counts(exp))


def test_slurm_gres_gpus():
  assert cluster.slurm_gres_gpus("gpu:4") == 4
  assert cluster.slurm_gres_gpus("gpu:a100:2(S:0-1)") == 2
  assert cluster.slurm_gres_gpus("gpu:a100:2(S:0),gpu:v100:1(S:1),shard:8") == 3
  assert cluster.slurm_gres_gpus("(null)") == cluster.slurm_gres_gpus("") == 0


def test_slurm_asks_for_gpus_only_on_the_learner_and_server_hosts_that_have_them():
  exp = _exp()
  placement = _placement(exp)
  # node2 runs the learner (2 devices) and both servers (a GPU each).
  assert cluster.gpu_requests(exp, placement, {"node1": 8, "node2": 8, "node3": 8}, "") == {
      "node1": 0, "node2": 4, "node3": 0}
  # A cluster without GPUs (the test cluster) is asked for none.
  assert cluster.gpu_requests(exp, placement, {"node1": 0, "node2": 0, "node3": 0}, "") == {
      "node1": 0, "node2": 0, "node3": 0}
  # --learner_devices 0: all of the learner host's GPUs; fewer GPUs than learner + servers: servers share.
  assert cluster.gpu_requests(_exp(learner_devices=0), placement, {"node2": 8}, "")["node2"] == 8
  assert cluster.gpu_requests(exp, placement, {"node2": 3}, "")["node2"] == 3
  with pytest.raises(ConfigError, match=r"^learner_devices: host node2 has 1 GPUs \(Slurm's Gres\) for 1 learner "
                                        r"process\(es\) of 2 devices each$"):
    cluster.gpu_requests(exp, placement, {"node2": 1}, "")
  # JAX_PLATFORMS=cpu keeps every process on the CPU: nothing asked.
  assert cluster.gpu_requests(exp, placement, {"node2": 8}, "cpu") == {"node1": 0, "node2": 0, "node3": 0}


def test_the_template_gets_the_gpus_the_hosts_nodes_take():
  exp = _exp(launcher="template", host_command="srun -w {host} --gres=gpu:{gpus} {command}")
  placement = _placement(exp)
  assert cluster.gpu_requests(exp, placement, None, "") == {"node1": 0, "node2": 4, "node3": 0}
  assert cluster.gpu_requests(_exp(learner_devices=0), placement, None, "")["node2"] == 3  # 1 + a GPU per server
  command = " ".join(shlex.quote(p) for p in (sys.executable, "-m", "launch.host", "/runs/r", "node2"))
  assert cluster.template_line(exp.host_command, "/runs/r", HOSTS[1], 4) == (
      f"srun -w node2 --gres=gpu:4 {command}")
  assert cluster.template_line("ssh {host} {command}", "/runs/r", HOSTS[0], 0) == (
      f"ssh node1 {command.replace('node2', 'node1')}")
  # A device run over hosts: each process is a learner of --learner_devices GPUs.
  device = ExperimentConfig(backend="device", env="gymnax:CartPole-v1", launcher="template", hosts="node1,node2",
                            host_command="{command} {gpus}", num_processes=2, learner_devices=1)
  two = parse_placement("device=node1,node2", HOSTS[:2], {"device": 2})
  assert cluster.gpu_requests(device, two, None, "") == {"node1": 1, "node2": 1}


def _agent(host):
  return " ".join(shlex.quote(p) for p in (sys.executable, "-m", "launch.host", "/runs/r", host))


def test_sbatch_without_gpus_is_one_job():
  lines = cluster.sbatch_lines("/runs/r", HOSTS, "jrl-dqn", "/work", {"node1": 0, "node2": 0, "node3": 0})
  assert lines == [
      "#!/bin/bash",
      "#SBATCH --job-name=jrl-dqn",
      "#SBATCH --nodes=3",
      "#SBATCH --nodelist=node1,node2,node3",
      "#SBATCH --ntasks-per-node=1",
      "#SBATCH --output=/runs/r/launch/slurm-%j.out",
      "# jrl program of /runs/r: one step per host, each running that host's nodes.",
      "cd /work",
      "pids=()",
      f"srun --exclusive -N1 -n1 -w node1 {_agent('node1')} &",
      "pids+=($!)",
      f"srun --exclusive -N1 -n1 -w node2 {_agent('node2')} &",
      "pids+=($!)",
      f"srun --exclusive -N1 -n1 -w node3 {_agent('node3')} &",
      "pids+=($!)",
      "status=0",
      'for pid in "${pids[@]}"; do wait "$pid" || { s=$?; [ "$status" -eq 0 ] && status=$s; }; done',
      "echo $status > /runs/r/launch/exit_status",
      "exit $status",
  ]
  assert cluster.sbatch_lines("/runs/r", HOSTS, "jrl-dqn", "/work") == lines


def test_sbatch_with_gpus_is_a_heterogeneous_job():
  lines = cluster.sbatch_lines("/runs/r", HOSTS, "jrl-dqn", "/work", {"node1": 0, "node2": 4, "node3": 0})
  assert lines[:15] == [
      "#!/bin/bash",
      "#SBATCH --job-name=jrl-dqn",
      "#SBATCH --nodes=2",
      "#SBATCH --nodelist=node1,node3",
      "#SBATCH --ntasks-per-node=1",
      "#SBATCH --output=/runs/r/launch/slurm-%j.out",
      "#SBATCH hetjob",
      "#SBATCH --nodes=1",
      "#SBATCH --nodelist=node2",
      "#SBATCH --ntasks-per-node=1",
      "#SBATCH --gres=gpu:4",
      "# jrl program of /runs/r: one step per host, each running that host's nodes.",
      "cd /work",
      "pids=()",
      f"srun --het-group=0 --exclusive -N1 -n1 -w node1 {_agent('node1')} &",
  ]
  assert lines[16] == f"srun --het-group=1 --exclusive -N1 -n1 -w node2 --gres=gpu:4 {_agent('node2')} &"
  assert lines[18] == f"srun --het-group=0 --exclusive -N1 -n1 -w node3 {_agent('node3')} &"


def test_each_node_on_a_gpu_host_starts_with_its_roles_devices():
  exp = _exp()
  counts = cluster.group_counts(exp)
  # An actor on the GPU host too: confined to the CPU there; node3's actors start as before.
  placement = parse_placement("replay,counter,evaluator=node1 learner,inference=node2 actor=node2,node3", HOSTS,
                              counts)
  envs = multihost.node_devices(placement, counts, {"node2": 4}, learner_devices=2)
  assert envs[("learner", 0)] == {"JAX_PLATFORMS": "cuda,cpu", "CUDA_VISIBLE_DEVICES": "0,1"}
  assert envs[("inference", 0)] == {"JAX_PLATFORMS": "cuda,cpu", "CUDA_VISIBLE_DEVICES": "2"}
  assert envs[("inference", 1)] == {"JAX_PLATFORMS": "cuda,cpu", "CUDA_VISIBLE_DEVICES": "3"}
  assert envs[("actor", 0)] == envs[("actor", 2)] == CPU_ONLY_ENV  # actors 0 and 2 on node2
  assert set(envs) == {("learner", 0), ("inference", 0), ("inference", 1), ("actor", 0), ("actor", 2)}
  # Two servers alone on a 1-GPU host share it, each with half of XLA's default memory.
  alone = parse_placement("replay,counter,evaluator,learner=node1 inference=node2 actor=node3", HOSTS, counts)
  shared = multihost.node_devices(alone, counts, {"node2": 1})
  assert shared[("inference", 0)] == shared[("inference", 1)] == {
      "JAX_PLATFORMS": "cuda,cpu", "CUDA_VISIBLE_DEVICES": "0", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.37"}
  assert multihost.node_devices(placement, counts, {}) == {}


def test_a_nodes_gpus_are_read_through_the_slurm_steps_own():
  env = {"JAX_PLATFORMS": "cuda,cpu", "CUDA_VISIBLE_DEVICES": "0,1"}
  assert multihost.visible_through(env, "2,3,5") == {"JAX_PLATFORMS": "cuda,cpu", "CUDA_VISIBLE_DEVICES": "2,3"}
  assert multihost.visible_through(env, "") == env
  assert multihost.visible_through(CPU_ONLY_ENV, "2,3") == CPU_ONLY_ENV
  plan = {"hosts": {"node2": {"nodes": [{"title": "learner/0", "command": ["x"], "env": env}]}}}
  assert multihost.host_commands(plan, "node2", "6,7")[0].env_overrides["CUDA_VISIBLE_DEVICES"] == "6,7"
