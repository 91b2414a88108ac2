"""Which accelerators each process of a run gets, and the environment it must start with.

JAX left alone in every process of a distributed run on a GPU host goes wrong three ways: every
process (actors, replay, counter, evaluator) opens every GPU, the first to start reserves 75% of
each GPU's memory (XLA's default preallocation) so the learner started after it runs out, and the
inference servers compute on the learner's GPU however many GPUs are free. The environment of a
process is the only place to say otherwise before JAX starts, so `place_roles` gives each role's
processes their devices and that environment, and the launchers start each process with it:

- the learner and the inference servers run on accelerators; every other role (actors, evaluator,
  replay, counter) is confined to the CPU: `JAX_PLATFORMS=cpu` (JAX opens no GPU backend) and an
  empty `CUDA_VISIBLE_DEVICES` (the CUDA plugin creates no context, which takes GPU memory too);
- the learner gets `--learner_devices` GPUs, the first ones (0 = all those not given to an
  inference server of its own); each inference server a GPU of its own where enough are left,
  else the free ones in turn, else the learner's in turn;
- an accelerator process sees only its devices (`CUDA_VISIBLE_DEVICES` / `HIP_VISIBLE_DEVICES`,
  so inside it they are devices 0..n-1) and names its platform first in `JAX_PLATFORMS`
  (`cuda,cpu`: a GPU that cannot start is an error, not a silent CPU run; the CPU backend stays for
  host-side jits);
- memory: a process alone on its GPUs keeps XLA's default (preallocate 75%: one allocation, no
  fragmentation). Processes that share a GPU each get `XLA_PYTHON_CLIENT_MEM_FRACTION` =
  0.75 / (processes on it), rounded down to a hundredth, preallocated: together they take what one
  process would have, each knows its share at start, and one running out fails at start, in its own
  process, instead of later in another's. (`XLA_PYTHON_CLIENT_PREALLOCATE=false` would let one
  process grow into another's share mid-run.)

A host without accelerators (or a run started with `JAX_PLATFORMS=cpu`) changes nothing: every
process gets an empty environment update and JAX runs on the CPU as before; `--learner_devices`
is then checked by the learner's mesh as today (a CPU host may fake devices with XLA_FLAGS).

This module is pure (no JAX import): the launcher must not open the GPUs it hands out, so
`host_accelerators` asks a short child process when a CUDA or ROCm plugin is installed.
"""

import dataclasses
import importlib.metadata
import json
import os
import subprocess
import sys
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from jrl.errors import ConfigError

# The roles of a distributed run (jrl.run.distributed.placement.GROUPS without the device-run "device").
ROLES = ("counter", "replay", "learner", "inference", "actor", "evaluator")
ACCELERATOR_ROLES = ("learner", "inference")
# platform -> the variable that hides that platform's devices from a process.
_VISIBLE = {"cuda": "CUDA_VISIBLE_DEVICES", "rocm": "HIP_VISIBLE_DEVICES"}
# XLA's default preallocation: what all processes on one GPU share between them.
_DEFAULT_FRACTION = 0.75
CPU_ONLY_ENV = {"JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": ""}


@dataclasses.dataclass(frozen=True)
class Accelerators:
  """The accelerators of one host, as JAX sees them: platform 'cpu' (count 0), 'cuda' or 'rocm'."""
  platform: str = "cpu"
  count: int = 0

  def __post_init__(self):
    if self.platform not in ("cpu",) + tuple(_VISIBLE):
      raise ValueError(f"platform must be cpu, cuda or rocm, got {self.platform!r}")
    if self.count < 0 or (self.platform == "cpu") != (self.count == 0):
      raise ValueError(f"a {self.platform} host with {self.count} devices")


@dataclasses.dataclass(frozen=True)
class Process:
  """One process of a role: the host's accelerator indices it runs on (() = the CPU) and what to add
  to its environment before it starts (empty: nothing changes)."""
  role: str
  index: int
  platform: str
  devices: Tuple[int, ...]
  env: Mapping[str, str]

  def describe(self) -> str:
    """'cpu', 'cuda:0' or 'cuda:0,1' (the host's device indices)."""
    return "cpu" if not self.devices else f"{self.platform}:{','.join(map(str, self.devices))}"


def _requested_accelerator(jax_platforms: str) -> Optional[str]:
  """The accelerator platform JAX_PLATFORMS asks for first ('' -> None: JAX picks)."""
  names = [p.strip().lower() for p in jax_platforms.split(",") if p.strip()]
  return names[0] if names else None


def _check_requested(host: Accelerators, jax_platforms: str) -> bool:
  """Whether the run is confined to the CPU by its JAX_PLATFORMS; ConfigError for a GPU asked for where
  JAX sees none."""
  first = _requested_accelerator(jax_platforms)
  if first is None:
    return False
  if first == "cpu":
    return True
  wanted = "cuda" if first == "gpu" else first
  if host.platform != wanted and not (first == "gpu" and host.platform in _VISIBLE):
    sees = "only the CPU" if host.platform == "cpu" else f"{host.count} {host.platform} devices"
    raise ConfigError("JAX_PLATFORMS", f"asks for {first}, but JAX sees {sees} on this host (no {first} device, "
                                       f"or its JAX plugin is not installed: make setup ACCEL=cuda12)")
  return False


def _memory_env(devices: Sequence[int], sharers: Mapping[int, int]) -> Dict[str, str]:
  most = max(sharers[d] for d in devices)
  if most == 1:
    return {}
  fraction = int(_DEFAULT_FRACTION / most * 100) / 100
  return {"XLA_PYTHON_CLIENT_MEM_FRACTION": f"{fraction:.2f}"}


def _accelerator_processes(host: Accelerators, assigned: Sequence[Tuple[str, int, Tuple[int, ...]]]) -> List[Process]:
  sharers = {d: sum(d in devices for _, _, devices in assigned) for d in range(host.count)}
  visible = _VISIBLE[host.platform]
  return [Process(role, index, host.platform, devices,
                  {"JAX_PLATFORMS": f"{host.platform},cpu", visible: ",".join(map(str, devices)),
                   **_memory_env(devices, sharers)})
          for role, index, devices in assigned]


def place_roles(host: Accelerators, learner_devices: int = 0, inference_servers: int = 0, actors: int = 0,
                evaluators: int = 1, replays: int = 1, counters: int = 1, learners: int = 1,
                jax_platforms: str = "") -> Dict[str, Tuple[Process, ...]]:
  """role -> its processes (index order), each with its devices and environment (module docstring).

  `learner_devices` is --learner_devices (0 = all the learner may have), `inference_servers` the
  number of inference servers (0 with --inference actor), `jax_platforms` the JAX_PLATFORMS the run
  was started with, `learners` its learner processes (--num_processes, all on this host: they
  split the learner's GPUs, a contiguous share each, or take them in turn where there are fewer; 0 on a
  host of a multi-host program without one, whose inference servers then take its GPUs in turn).
  ConfigError: more --learner_devices than the host has, a GPU asked for in JAX_PLATFORMS where JAX
  sees none, a negative count.
  """
  counts = {"counter": counters, "replay": replays, "learner": learners, "inference": inference_servers,
            "actor": actors, "evaluator": evaluators}
  if learners < 0:
    raise ConfigError("num_processes", f"must be >= 1, got {learners}")
  for field, value in (("learner_devices", learner_devices), ("num_inference_servers", inference_servers),
                       ("num_actors", actors), ("evaluators", evaluators), ("replays", replays),
                       ("counters", counters)):
    if value < 0:
      raise ConfigError(field, f"must be >= 0, got {value}")
  cpu_only = _check_requested(host, jax_platforms)
  if host.platform == "cpu" or cpu_only:
    return {role: tuple(Process(role, i, "cpu", (), {}) for i in range(counts[role])) for role in ROLES}
  n = host.count
  if learner_devices > n:
    raise ConfigError("learner_devices", f"must be in [0, {n}] (0 = all): this host has {n} {host.platform} "
                                         f"devices, got {learner_devices}")
  if not learners:  # a host of a multi-host program with inference servers and no learner
    learner = ()
  elif learner_devices:
    learner = tuple(range(learner_devices))
  elif n > inference_servers:
    learner = tuple(range(n - inference_servers))  # all but a GPU of its own for each server
  else:
    learner = tuple(range(n))
  free = [d for d in range(n) if d not in learner]
  pool = free if free else list(learner)
  servers = [(pool[i % len(pool)],) for i in range(inference_servers)]
  share = len(learner) // learners if learners else 0
  shares = ([learner[i * share:(i + 1) * share] for i in range(learners)] if share
            else [(learner[i % len(learner)],) for i in range(learners)])
  assigned = ([("learner", i, tuple(d)) for i, d in enumerate(shares)]
              + [("inference", i, s) for i, s in enumerate(servers)])
  placed = _accelerator_processes(host, assigned)
  roles: Dict[str, Tuple[Process, ...]] = {
    "learner": tuple(p for p in placed if p.role == "learner"),
    "inference": tuple(p for p in placed if p.role == "inference"),
  }
  for role in ROLES:
    if role not in ACCELERATOR_ROLES:
      roles[role] = tuple(Process(role, i, "cpu", (), dict(CPU_ONLY_ENV)) for i in range(counts[role]))
  return {role: roles[role] for role in ROLES}


def place_sweep(host: Accelerators, parallel: int, jax_platforms: str = "") -> Tuple[Process, ...]:
  """The --parallel slots of a sweep (`launch.sweep`: a run starts in a free slot): slot i on GPU i mod
  the host's count, so each run has a GPU of its own where there are `parallel`; runs sharing a GPU
  split its memory as in `place_roles`. A CPU host: every slot unchanged."""
  if parallel < 1:
    raise ConfigError("parallel", f"must be >= 1, got {parallel}")
  cpu_only = _check_requested(host, jax_platforms)
  if host.platform == "cpu" or cpu_only:
    return tuple(Process("run", i, "cpu", (), {}) for i in range(parallel))
  return tuple(_accelerator_processes(host, [("run", i, (i % host.count,)) for i in range(parallel)]))


def describe(placement: Mapping[str, Sequence[Process]]) -> Dict[str, List[str]]:
  """role -> each process's devices ('cpu', 'cuda:0,1'), for a run's summary."""
  return {role: [p.describe() for p in processes] for role, processes in placement.items() if processes}


# --actor_device: where an embedded run's policy acts (ExperimentConfig.actor_device).
ACTOR_DEVICES = ("auto", "cpu", "accelerator")
# `auto` on an accelerator host: a policy call of at most this many FLOPs (XLA's count, for the actor's batch)
# acts on the CPU, a bigger one on the accelerator. An accelerator's call, however small, costs the actor a round
# trip at every step (observations in, kernel launches, actions out), which a small program on the CPU undercuts;
# a big one (a CNN on a batch of frames) is faster on the accelerator. Acme compiles its actors' policies for the
# CPU (jax.jit(..., backend='cpu')); SEED RL and Sebulba batch many envs' observations on the accelerator. This
# bound is reasoned from the CPU's measured cost of jrl's policies (docs/accelerators.md), not measured on a GPU;
# bench/accelerator_check.py's embedded arms measure both placements.
ACTOR_CPU_MAX_FLOPS = 1e6


def actor_device(setting: str, platform: str, flops_per_call: Optional[float] = None) -> str:
  """Where an embedded run's policy acts: 'cpu' or 'accelerator' (the learner's first device).

  `setting` is --actor_device, `platform` JAX's default backend in the process ('cpu', 'gpu', 'tpu'),
  `flops_per_call` the policy's FLOPs for one call on the actor's batch (None: unknown, the accelerator).
  'auto' is the CPU on a CPU host (nothing changes) and on an accelerator host by ACTOR_CPU_MAX_FLOPS;
  ConfigError for 'accelerator' where JAX sees none, or a setting not in ACTOR_DEVICES.
  """
  if setting not in ACTOR_DEVICES:
    raise ConfigError("actor_device", f"must be one of {', '.join(ACTOR_DEVICES)}, got '{setting}'")
  if platform == "cpu":
    if setting == "accelerator":
      raise ConfigError("actor_device", "asks for the accelerator, but JAX sees only the CPU in this process (no GPU, "
                                        "or its JAX plugin is not installed: make setup ACCEL=cuda12)")
    return "cpu"
  if setting != "auto":
    return setting
  return "cpu" if flops_per_call is not None and flops_per_call <= ACTOR_CPU_MAX_FLOPS else "accelerator"


def _installed_plugins() -> List[str]:
  names = []
  for dist in importlib.metadata.distributions():
    name = (dist.metadata["Name"] or "").lower()
    if name.startswith(("jax-cuda", "jax-rocm")) and name.endswith("-plugin"):
      names.append(name)
  return names


def host_accelerators(env: Optional[Mapping[str, str]] = None, timeout: float = 120.0) -> Accelerators:
  """This host's accelerators, without opening them in this process (the launcher hands them out).

  No CUDA or ROCm plugin installed (make setup without ACCEL): the CPU, at once. Otherwise a child
  process asks JAX, with preallocation off and JAX_PLATFORMS/visible devices as in `env` (default:
  this process's), so it sees what the run's processes will see.
  """
  env = dict(os.environ if env is None else env)
  if not _installed_plugins():
    return Accelerators()
  env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
  probe = ("import json, jax\n"
           "devices = [d for d in jax.devices() if d.platform != 'cpu']\n"
           "version = devices[0].client.platform_version.lower() if devices else ''\n"
           "kind = ('rocm' if 'rocm' in version else 'cuda') if devices and devices[0].platform == 'gpu' else 'cpu'\n"
           "print(json.dumps({'platform': kind, 'count': len(devices)}))\n")
  result = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=timeout)
  lines = result.stdout.strip().splitlines()
  if result.returncode != 0 or not lines:
    return Accelerators()  # JAX found no usable accelerator (no driver, no device): the CPU
  found = json.loads(lines[-1])
  if found["platform"] not in _VISIBLE or not found["count"]:
    return Accelerators()  # a TPU host, say: not placed, every process unchanged
  return Accelerators(found["platform"], int(found["count"]))


def ray_gpus(cluster_gpus: float, learner_devices: int = 0, learners: int = 1, inference_servers: int = 0
             ) -> Dict[str, Tuple[float, ...]]:
  """The GPUs each accelerator process of a Ray program asks Ray for (`--engine ray`), as `place_roles`
  places them on one host: each learner process `--learner_devices` / learners of them (all but one
  for each inference server, at least one; 0 = as many as that), each inference server one where that
  many are left, else none; every other role none (it starts with CPU_ONLY_ENV). A cluster without
  GPUs: none anywhere. Ray gives each process the GPUs it asked for as its CUDA_VISIBLE_DEVICES."""
  if learners < 1:
    raise ConfigError("num_processes", f"must be >= 1, got {learners}")
  gpus = int(cluster_gpus)
  if gpus <= 0:
    return {"learner": (0.0,) * learners, "inference": (0.0,) * inference_servers}
  if learner_devices > gpus:
    raise ConfigError("learner_devices", f"asks for {learner_devices} GPUs; the Ray cluster has {gpus}")
  total = learner_devices or max(learners, gpus - inference_servers)
  per_learner = max(1, total // learners)
  left = gpus - per_learner * learners
  if left < 0:
    raise ConfigError("num_processes", f"{learners} learner processes need a GPU each; the Ray cluster has {gpus}")
  server = 1.0 if left >= inference_servers else 0.0
  return {"learner": (float(per_learner),) * learners, "inference": (server,) * inference_servers}
