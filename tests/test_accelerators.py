"""Placement by role (jrl/accelerators.py): which accelerators each process of a run gets and the environment
it starts with, on hosts of 0, 1, 2 and 8 GPUs; a sweep's --parallel slots; bad requests refused."""

import functools
import json
import os
import runpy
import subprocess
import sys

import pytest

from jrl.accelerators import CPU_ONLY_ENV, Accelerators, describe, host_accelerators, place_roles, place_sweep
from jrl.errors import ConfigError

CPU = Accelerators()


def gpus(n):
  return Accelerators("cuda", n)


def devices(placement, role):
  return [p.devices for p in placement[role]]


def test_cpu_only_host_changes_nothing():
  """No accelerator: every process of every role starts with the environment it had, on the CPU."""
  placement = place_roles(CPU, learner_devices=2, inference_servers=2, actors=4)
  assert {role: len(ps) for role, ps in placement.items()} == {
    "counter": 1, "replay": 1, "learner": 1, "inference": 2, "actor": 4, "evaluator": 1}
  for processes in placement.values():
    for p in processes:
      assert p.env == {} and p.devices == () and p.describe() == "cpu"
  # JAX_PLATFORMS=cpu on a GPU host: the run asked for the CPU, so the same.
  assert place_roles(gpus(2), inference_servers=1, actors=2, jax_platforms="cpu") == \
    place_roles(CPU, inference_servers=1, actors=2)


def test_one_gpu_learner_and_server_share_it_and_split_its_memory():
  placement = place_roles(gpus(1), inference_servers=1, actors=3)
  learner, = placement["learner"]
  server, = placement["inference"]
  assert learner.devices == server.devices == (0,)
  for p in (learner, server):
    assert p.env == {"JAX_PLATFORMS": "cuda,cpu", "CUDA_VISIBLE_DEVICES": "0", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.37"}
  for role in ("actor", "evaluator", "replay", "counter"):
    for p in placement[role]:
      assert p.env == CPU_ONLY_ENV and p.env["JAX_PLATFORMS"] == "cpu" and p.env["CUDA_VISIBLE_DEVICES"] == ""
  assert len(placement["actor"]) == 3


def test_one_gpu_learner_alone_keeps_xla_default_memory():
  """Inference on the actors: the learner is alone on its GPU, so nothing about memory is set."""
  learner, = place_roles(gpus(1), actors=2)["learner"]
  assert learner.env == {"JAX_PLATFORMS": "cuda,cpu", "CUDA_VISIBLE_DEVICES": "0"}
  assert "XLA_PYTHON_CLIENT_PREALLOCATE" not in learner.env


def test_two_gpus():
  # One server: the learner on GPU 0, the server on GPU 1, each alone.
  placement = place_roles(gpus(2), inference_servers=1, actors=4)
  assert devices(placement, "learner") == [(0,)] and devices(placement, "inference") == [(1,)]
  assert placement["inference"][0].env == {"JAX_PLATFORMS": "cuda,cpu", "CUDA_VISIBLE_DEVICES": "1"}
  # No server: the learner takes both (0 = all).
  assert devices(place_roles(gpus(2)), "learner") == [(0, 1)]
  # --learner_devices 2 and a server: the server shares, in turn, the learner's GPUs.
  placement = place_roles(gpus(2), learner_devices=2, inference_servers=2)
  assert devices(placement, "learner") == [(0, 1)] and devices(placement, "inference") == [(0,), (1,)]
  assert {p.env["XLA_PYTHON_CLIENT_MEM_FRACTION"] for p in placement["learner"] + placement["inference"]} == {"0.37"}
  # Two servers, learner_devices 0: not enough for a GPU each beside the learner, so all three share.
  placement = place_roles(gpus(2), inference_servers=2)
  assert devices(placement, "learner") == [(0, 1)] and devices(placement, "inference") == [(0,), (1,)]


def test_eight_gpus():
  # --learner_devices 4, 4 servers: a GPU each.
  placement = place_roles(gpus(8), learner_devices=4, inference_servers=4, actors=16)
  assert devices(placement, "learner") == [(0, 1, 2, 3)]
  assert devices(placement, "inference") == [(4,), (5,), (6,), (7,)]
  assert placement["learner"][0].env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
  assert all("XLA_PYTHON_CLIENT_MEM_FRACTION" not in p.env for p in placement["learner"] + placement["inference"])
  assert describe(placement) == {
    "counter": ["cpu"], "replay": ["cpu"], "learner": ["cuda:0,1,2,3"],
    "inference": ["cuda:4", "cuda:5", "cuda:6", "cuda:7"], "actor": ["cpu"] * 16, "evaluator": ["cpu"]}
  # learner_devices 0 and 2 servers: the learner all but the servers' two.
  placement = place_roles(gpus(8), inference_servers=2)
  assert devices(placement, "learner") == [tuple(range(6))] and devices(placement, "inference") == [(6,), (7,)]
  # 6 servers beside --learner_devices 6: two free GPUs, three servers on each.
  placement = place_roles(gpus(8), learner_devices=6, inference_servers=6)
  assert devices(placement, "inference") == [(6,), (7,), (6,), (7,), (6,), (7,)]
  assert {p.env["XLA_PYTHON_CLIENT_MEM_FRACTION"] for p in placement["inference"]} == {"0.25"}
  assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in placement["learner"][0].env
  # --learner_devices 8, no server: every GPU, alone.
  assert devices(place_roles(gpus(8), learner_devices=8), "learner") == [tuple(range(8))]


def test_learner_processes_split_the_learners_gpus():
  placement = place_roles(gpus(8), learner_devices=4, inference_servers=2, learners=2)
  assert devices(placement, "learner") == [(0, 1), (2, 3)] and devices(placement, "inference") == [(4,), (5,)]
  placement = place_roles(gpus(1), learners=2)
  assert devices(placement, "learner") == [(0,), (0,)]
  assert {p.env["XLA_PYTHON_CLIENT_MEM_FRACTION"] for p in placement["learner"]} == {"0.37"}
  assert [p.env for p in place_roles(CPU, learners=3)["learner"]] == [{}, {}, {}]


def test_rocm_hides_devices_with_its_own_variable():
  learner, = place_roles(Accelerators("rocm", 2), learner_devices=1)["learner"]
  assert learner.env == {"JAX_PLATFORMS": "rocm,cpu", "HIP_VISIBLE_DEVICES": "0"}


def test_more_learner_devices_than_the_host_has_is_refused():
  with pytest.raises(ConfigError) as info:
    place_roles(gpus(2), learner_devices=3)
  assert str(info.value) == "learner_devices: must be in [0, 2] (0 = all): this host has 2 cuda devices, got 3"
  with pytest.raises(ConfigError, match="^learner_devices: must be >= 0, got -1$"):
    place_roles(gpus(2), learner_devices=-1)


@pytest.mark.parametrize("jax_platforms", ["cuda", "gpu", "cuda,cpu", "rocm"])
def test_gpu_asked_for_where_jax_sees_none_is_refused(jax_platforms):
  with pytest.raises(ConfigError) as info:
    place_roles(CPU, jax_platforms=jax_platforms)
  first = jax_platforms.split(",")[0]
  assert str(info.value).startswith(f"JAX_PLATFORMS: asks for {first}, but JAX sees only the CPU on this host")
  with pytest.raises(ConfigError, match=f"^JAX_PLATFORMS: asks for {first}, but JAX sees only the CPU"):
    place_sweep(CPU, 2, jax_platforms=jax_platforms)


def test_gpu_asked_for_where_there_are_gpus_is_placed():
  assert devices(place_roles(gpus(2), jax_platforms="cuda"), "learner") == [(0, 1)]
  assert devices(place_roles(gpus(2), jax_platforms="gpu"), "learner") == [(0, 1)]
  with pytest.raises(ConfigError, match="^JAX_PLATFORMS: asks for rocm, but JAX sees 2 cuda devices"):
    place_roles(gpus(2), jax_platforms="rocm")


def test_sweep_parallel_gives_each_run_its_own_gpu_where_there_are_enough():
  slots = place_sweep(gpus(4), 4)
  assert [s.devices for s in slots] == [(0,), (1,), (2,), (3,)]
  assert [s.env for s in slots] == [{"JAX_PLATFORMS": "cuda,cpu", "CUDA_VISIBLE_DEVICES": str(i)} for i in range(4)]
  # Fewer GPUs than runs: in turn, splitting the memory of the GPUs shared.
  slots = place_sweep(gpus(2), 3)
  assert [s.devices for s in slots] == [(0,), (1,), (0,)]
  assert [s.env.get("XLA_PYTHON_CLIENT_MEM_FRACTION") for s in slots] == ["0.37", None, "0.37"]
  # One run on an 8-GPU host: GPU 0, alone.
  assert [s.describe() for s in place_sweep(gpus(8), 1)] == ["cuda:0"]
  # A CPU host: unchanged.
  assert [s.env for s in place_sweep(CPU, 3)] == [{}, {}, {}]
  with pytest.raises(ConfigError, match="^parallel: must be >= 1, got 0$"):
    place_sweep(gpus(2), 0)


def test_this_hosts_accelerators():
  """This venv has no CUDA plugin (make setup without ACCEL): the CPU, without starting JAX anywhere."""
  assert host_accelerators() == CPU


def test_with_a_cuda_plugin_installed_a_child_process_asks_jax(tmp_path, monkeypatch):
  """A CUDA plugin's metadata on the path (as make setup ACCEL=cuda12 leaves it) makes host_accelerators ask
  JAX in a child process; on this host without a GPU (and without the plugin's code) JAX answers the CPU."""
  info = tmp_path / "jax_cuda12_plugin-0.6.2.dist-info"
  info.mkdir()
  (info / "METADATA").write_text("Metadata-Version: 2.1\nName: jax-cuda12-plugin\nVersion: 0.6.2\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  from jrl import accelerators
  assert accelerators._installed_plugins() == ["jax-cuda12-plugin"]
  assert host_accelerators() == CPU
  # JAX_PLATFORMS=cuda there: the child fails to start JAX, which is the CPU too (place_roles then refuses).
  assert host_accelerators({**os.environ, "JAX_PLATFORMS": "cuda"}) == CPU


def test_accelerators_reject_impossible_hosts():
  for bad in (("cuda", 0), ("cpu", 2), ("tpu", 4)):
    with pytest.raises(ValueError):
      Accelerators(*bad)


# What each node of the program below runs: the backend JAX picked and the placement's variables, as it saw them.
_NODE_SCRIPT = """
import json, os
import jax
names = ("JAX_PLATFORMS", "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "JRL_TEST_MARK")
with open(out, "w") as f:
  json.dump({"backend": jax.default_backend(), "devices": [d.platform for d in jax.devices()],
             "env": {k: os.environ.get(k) for k in names}}, f)
"""


@pytest.mark.slow
@pytest.mark.needs_reverb
def test_each_node_starts_with_its_roles_environment(tmp_path):
  """Real Launchpad nodes (local_mp under jrl's supervisor, as `launch.train --distributed` starts them) each
  start with their role's environment. This host has no GPU, so every role reports the CPU; the CPU roles
  get the environment a GPU host gives them (JAX_PLATFORMS=cpu, no visible GPU), the learner and inference
  server this host's (nothing added) plus a marker, so what arrives is each node's own."""
  import launchpad as lp

  from launch import supervisor

  script = tmp_path / "node.py"
  script.write_text(_NODE_SCRIPT)
  counts = {"counter": 1, "replay": 1, "learner": 1, "inference": 1, "actor": 2, "evaluator": 1}
  gpu_host = place_roles(gpus(2), inference_servers=1, actors=2)
  this_host = place_roles(host_accelerators(), inference_servers=1, actors=2)
  node_envs = {}
  for role, processes in gpu_host.items():
    for p in processes:
      mine = this_host[role][p.index]
      node_envs[f"{role}/{p.index}"] = ({**mine.env, "JRL_TEST_MARK": f"{role}/{p.index}"}
                                        if role in ("learner", "inference") else dict(p.env))
  program = lp.Program("placement")
  for role, n in counts.items():
    with program.group(role):
      for i in range(n):
        out = str(tmp_path / f"{role}-{i}.json")
        program.add_node(lp.PyNode(functools.partial(runpy.run_path, str(script), init_globals={"out": out})))
  policy = supervisor.RestartPolicy()
  supervisor.launch(program, str(tmp_path / "run"), policy, {}, node_envs).wait()
  for role, n in counts.items():
    for i in range(n):
      seen = json.loads((tmp_path / f"{role}-{i}.json").read_text())
      assert seen["backend"] == "cpu" and set(seen["devices"]) == {"cpu"}, (role, seen)
      if role in ("learner", "inference"):
        assert seen["env"]["JRL_TEST_MARK"] == f"{role}/{i}" and seen["env"]["JAX_PLATFORMS"] in (None, "cpu")
      else:
        assert seen["env"] == {"JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": "",
                               "JRL_TEST_MARK": None}, (role, seen)


@pytest.mark.needs_reverb
def test_distributed_run_asking_for_a_gpu_jax_does_not_see_is_one_line(tmp_path):
  """Refused in the launcher before a run directory is made or a node started: one line, exit 2."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  command = [sys.executable, "-m", "launch.train", "--distributed", "--run_dir", str(tmp_path / "run")]
  out = subprocess.run(command, cwd=root, text=True, capture_output=True, timeout=120,
                       env={**os.environ, "JAX_PLATFORMS": "cuda"})
  assert out.returncode == 2, out.stderr[-2000:]
  assert out.stderr.strip() == ("python -m launch.train: error: JAX_PLATFORMS: asks for cuda, but JAX sees only the "
                                "CPU on this host (no cuda device, or its JAX plugin is not installed: make setup "
                                "ACCEL=cuda12)")
  assert not (tmp_path / "run").exists()


def test_sweep_parallel_runs_each_start_with_their_slots_gpu(tmp_path):
  """launch.sweep --parallel 2 on a host given as 2 GPUs: the two runs at once each see a GPU of their own; the
  third, started when one ended, takes the freed slot's. (The jobs only report their environment: no JAX.)"""
  from launch import sweep
  report = ("import json, os, time; time.sleep(0.5); "
            "print(json.dumps([os.environ.get('CUDA_VISIBLE_DEVICES'), os.environ.get('JAX_PLATFORMS')]))")
  jobs = [sweep.Job(seed, f"s{seed}", [sys.executable, "-c", report]) for seed in range(3)]
  outcomes = sweep.run_jobs(jobs, 2, str(tmp_path / "logs"), lambda outcome: None, host=gpus(2))
  assert [o.returncode for o in outcomes] == [0, 0, 0]
  seen = [json.loads((tmp_path / "logs" / f"s{seed}.log").read_text().strip().splitlines()[-1]) for seed in range(3)]
  assert seen[0] == ["0", "cuda,cpu"] and seen[1] == ["1", "cuda,cpu"]
  assert seen[2] in (["0", "cuda,cpu"], ["1", "cuda,cpu"])
  # This CPU host: the runs' environment is left as it was.
  outcomes = sweep.run_jobs(jobs[:2], 2, str(tmp_path / "cpu"), lambda outcome: None)
  seen = [json.loads((tmp_path / "cpu" / f"s{seed}.log").read_text().strip().splitlines()[-1]) for seed in range(2)]
  assert all(s == [os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("JAX_PLATFORMS")] for s in seen)
