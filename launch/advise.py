"""Topology advisor: measures this machine, then recommends how to run an agent on it.

  python -m launch.advise --agent dqn --env CartPole-v1 [--seconds 0.5] [--cores N] [--max_actors N]
                          [--rpc_ms 1.0] [--any_agent_field VALUE ...]

It measures, with the library's own pieces (the actor shell and its phase timer, the jitted
policy, the learner shell, Reverb inserts and the runner's batch prefetching), on this machine:

  env        seconds per vector step of n envs, for several n (env bookkeeping included)
  policy     seconds per policy call on a batch of b observations, for several b
  insert     seconds per vector step of n envs through the n-step adder, the block writer
             and Reverb inserts
  learner    seconds per learner call of U updates fed from Reverb through the prefetch
             thread, as the runner feeds it (wall and CPU), and per sample (+ batch assembly
             and placement) of one call's items alone, for several U

each twice: with the Reverb server in this process, as an embedded run has it (Reverb then
skips gRPC), and in a replay process of its own, as a distributed program has it (every insert
and sample crosses gRPC, which costs both processes CPU; the replay process's CPU is measured
too). Without Reverb (a core install) it measures the seeded buffer of a --deterministic run,
whose batches are drawn in the learner's thread, and considers only embedded runs.

and predicts the env-steps/s of the training loop (evaluation, checkpoints and compilation
left out) for each candidate topology: embedded (one process), or --distributed with A
actors running the policy themselves (--inference actor) or asking a batched server
(--inference server), each with n envs per actor and U updates per learner call. The agent's
samples_per_insert is kept: it is part of the algorithm, not of the topology.

The model (`predict`, pure, tested on hand-made costs) per env step:

  embedded   main thread:  (env(n) + policy(n)) / n + insert + c(U) * learner(U)
             prefetch thread: c(U) * sample(U), in parallel when there are 2+ cores
             (in the main thread too without Reverb: a --deterministic run has no prefetch thread)
  actor      A actors each (env(n) + policy(n)) / n + insert, in parallel; the learner
             bounds the rate at 1 / (c(U) * max(learner(U), sample(U))); all of it shares the cores,
             the replay process's CPU included; insert, learner and sample are the remote figures
  server     actors wait env(n) + rpc + policy(A n) per vector step; the server's batch is
             every actor's request (A n observations)

where c(U) = samples_per_insert / (U * batch_size) learner calls per env step (on-policy
agents: one call per batch_size sequences of sequence_length steps). CPU: the sum of the
work per env step over all processes cannot exceed the cores (less SIDE_PROCESSES_CORES for
a distributed program's counter, evaluator and parameter copies). `rpc` is not measured
(courier and TensorFlow are heavy to load): --rpc_ms, 1 ms by default, of which each end
spends a quarter on the CPU. The server pays off where CPU is short and the policy is
costly: it computes once per batch what every actor would compute.

The recommendation is the fastest prediction, except that a simpler topology (embedded
before distributed, fewer actors, fewer envs, fewer updates per call) within --margin
(15%) of it wins: the model leaves out the costs distribution adds (process start-up,
parameter fetches, serialisation).
"""

import argparse
import collections
import contextlib
import dataclasses
import math
import os
import pickle
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

PROG = "python -m launch.advise"
ENV_SIZES = (1, 2, 4, 8, 16, 32, 64)
POLICY_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
UPDATES_PER_CALL = (1, 2, 4, 8, 16)
ACTOR_COUNTS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
SIDE_PROCESSES_CORES = 0.2  # counter, evaluator and the learner's parameter copies for the actors (distributed)
PLACEMENT_ORDER = {"embedded": 0, "actor": 1, "server": 2}
RPC_CPU_SHARE = 0.25  # CPU each end spends per request, as a share of the round trip (assumed)
REMOTE = ("insert", "actor_cpu", "learner", "learner_cpu", "sample")  # Costs tables with a remote_ twin


@dataclasses.dataclass
class Costs:
  """Measured seconds (see the module docstring)."""
  env: Dict[int, float]            # per vector step of n envs
  policy: Dict[int, float]         # per policy call on b observations
  insert: Dict[int, float]         # per vector step of n envs: adder, block writer, Reverb inserts
  learner: Dict[int, float]        # per learner call of U updates, fed from Reverb as the runner feeds it
  sample: Dict[int, float]         # per sample + assembly + placement of one call's items, alone
  cores: float
  rpc: float = 1e-3                # per request to another process (round trip)
  # CPU seconds (all threads of the process) of the same work, where it differs from the
  # wall time: Reverb's gRPC and sampling threads, XLA's threads. None: as the wall time.
  actor_cpu: Optional[Dict[int, float]] = None   # per vector step of n envs (env, policy, insert)
  learner_cpu: Optional[Dict[int, float]] = None  # per learner call, its prefetch thread's sampling included
  # The same with replay in a process of its own, over gRPC (distributed placements; None: as the
  # local table), and that replay process's CPU per vector step inserted and per call sampled.
  remote_insert: Optional[Dict[int, float]] = None
  remote_actor_cpu: Optional[Dict[int, float]] = None
  remote_learner: Optional[Dict[int, float]] = None
  remote_learner_cpu: Optional[Dict[int, float]] = None
  remote_sample: Optional[Dict[int, float]] = None
  replay_insert_cpu: Optional[Dict[int, float]] = None
  replay_sample_cpu: Optional[Dict[int, float]] = None
  prefetch: bool = True            # False (no Reverb: --deterministic): sampling runs in the learner's thread
  distributed: bool = True         # this install can run distributed topologies (the jrl[distributed] extra)

  def placed(self, placement: str) -> "Costs":
    """The costs a topology pays: a distributed program's actors and learner reach replay in
    another process, so theirs are the remote tables, where measured."""
    if placement == "embedded":
      return self
    remote = {name: getattr(self, "remote_" + name) for name in REMOTE}
    return dataclasses.replace(self, **{k: v for k, v in remote.items() if v is not None})


@dataclasses.dataclass(frozen=True)
class Workload:
  """What the agent asks of replay and the learner."""
  batch_size: int
  samples_per_insert: float        # rows sampled per env step (off-policy: transitions, or R2D2's sequences)
  sequence_length: int = 0         # on-policy: one learner call per batch_size sequences of this length

  def calls_per_step(self, updates_per_call: int) -> float:
    if self.sequence_length:
      return 1.0 / (self.batch_size * self.sequence_length)
    return self.samples_per_insert / (updates_per_call * self.batch_size)


@dataclasses.dataclass(frozen=True)
class Topology:
  placement: str                   # "embedded", "actor" (distributed, policy in each actor) or "server"
  num_actors: int
  num_envs: int
  updates_per_call: int

  def simplicity(self) -> Tuple[int, int, int, int]:
    return (PLACEMENT_ORDER[self.placement], self.num_actors, self.num_envs, self.updates_per_call)


@dataclasses.dataclass
class Prediction:
  topology: Topology
  env_steps_per_second: float
  bound: str                       # what limits it: env, policy, insert, learner, replay, server, cpu
  limits: Dict[str, float]         # env-steps/s each part alone would allow


def at(table: Dict[int, float], x: float) -> float:
  """Piecewise-linear interpolation of a measured table; linear extrapolation past its ends."""
  keys = sorted(table)
  if x in table:
    return table[x]
  if len(keys) == 1:
    return table[keys[0]] * x / keys[0]
  if x <= keys[0]:
    lo, hi = keys[0], keys[1]
  elif x >= keys[-1]:
    lo, hi = keys[-2], keys[-1]
  else:
    hi = next(k for k in keys if k > x)
    lo = keys[keys.index(hi) - 1]
  slope = (table[hi] - table[lo]) / (hi - lo)
  return max(table[lo] + slope * (x - lo), 1e-9)


def predict(costs: Costs, work: Workload, topo: Topology) -> Prediction:
  """Env-steps/s of the training loop for one topology (see the module docstring)."""
  costs = costs.placed(topo.placement)
  n, a = topo.num_envs, topo.num_actors
  u = 1 if work.sequence_length else topo.updates_per_call  # on-policy calls are whole batches of sequences
  calls = work.calls_per_step(u)
  learn, sample = calls * at(costs.learner, u), calls * at(costs.sample, u)
  env, insert = at(costs.env, n) / n, at(costs.insert, n) / n
  # CPU seconds per env step of the learner side (update and sampling, their threads included).
  if costs.learner_cpu is not None:
    learner_cpu = calls * at(costs.learner_cpu, u)
  else:
    learner_cpu = calls * (at(costs.learner, u) + at(costs.sample, u))
  limits: Dict[str, float] = {}
  if topo.placement == "embedded":
    policy = at(costs.policy, n) / n
    main = {"env": env, "policy": policy, "insert": insert, "learner": learn}
    overlap = costs.prefetch and costs.cores >= 2  # the prefetch thread samples while the main thread works
    if not overlap:  # sampling adds to the main thread's work
      main["replay"] = sample
    serial = sum(main.values())
    limits = {k: 1.0 / v for k, v in main.items() if v > 0}
    if overlap:
      limits["replay"] = 1.0 / sample if sample > 0 else math.inf
    limits["cpu"] = costs.cores / (at(costs.actor_cpu or _sum(costs.env, costs.policy, costs.insert), n) / n
                                   + learner_cpu)
    rate = min(1.0 / serial, limits.get("replay", math.inf), limits["cpu"])
    if rate >= (1.0 - 1e-6) / serial:
      bound = max(main, key=main.get)
    else:
      bound = "replay" if limits.get("replay", math.inf) <= limits["cpu"] else "cpu"
    return Prediction(topo, rate, bound, limits)

  cores = max(costs.cores - SIDE_PROCESSES_CORES, 0.5)
  replay_cpu = ((at(costs.replay_insert_cpu, n) / n if costs.replay_insert_cpu else 0.0)
                + (calls * at(costs.replay_sample_cpu, u) if costs.replay_sample_cpu else 0.0))
  if topo.placement == "actor":
    policy = at(costs.policy, n) / n
    actor_step = env + policy + insert
    limits["env" if env >= policy + insert else ("policy" if policy >= insert else "insert")] = a / actor_step
    cpu = at(costs.actor_cpu or _sum(costs.env, costs.policy, costs.insert), n) / n + learner_cpu + replay_cpu
  elif topo.placement == "server":
    batch = a * n
    server_call = at(costs.policy, batch)
    actor_step = (at(costs.env, n) + costs.rpc + server_call) / n + insert
    limits["env" if env >= (costs.rpc + server_call) / n else "server"] = a / actor_step
    limits["server"] = min(limits.get("server", math.inf), batch / (server_call + costs.rpc))
    # Each request costs CPU on both ends (RPC_CPU_SHARE of its round trip each); the
    # server computes once per batch.
    actor_cpu = at(costs.actor_cpu or _sum(costs.env, costs.policy, costs.insert), n) - at(costs.policy, n)
    cpu = actor_cpu / n + server_call / batch + 2 * RPC_CPU_SHARE * costs.rpc / n + learner_cpu + replay_cpu
  else:
    raise ValueError(f"unknown placement '{topo.placement}'")
  limits["learner" if at(costs.learner, u) >= at(costs.sample, u) else "replay"] = (
      1.0 / max(learn, sample) if max(learn, sample) > 0 else math.inf)
  limits["cpu"] = cores / cpu
  bound = min(limits, key=limits.get)
  return Prediction(topo, limits[bound], bound, limits)


def _sum(*tables: Dict[int, float]) -> Dict[int, float]:
  return {k: sum(t[k] for t in tables) for k in tables[0]}


def candidates(costs: Costs, max_actors: int) -> List[Topology]:
  envs = sorted(costs.env)
  updates = sorted(costs.learner)
  out = [Topology("embedded", 1, n, u) for n in envs for u in updates]
  for a in ACTOR_COUNTS if costs.distributed else ():
    if a > max_actors:
      break
    for placement in ("actor", "server"):
      out += [Topology(placement, a, n, u) for n in envs for u in updates]
  return out


def recommend(costs: Costs, work: Workload, max_actors: int, margin: float = 0.15,
              allowed: Optional[Callable[[Topology], bool]] = None) -> Tuple[Prediction, List[Prediction]]:
  """The recommended prediction and every prediction, fastest first. Within `margin` of the
  fastest, the simplest topology wins."""
  predictions = [predict(costs, work, t) for t in candidates(costs, max_actors) if allowed is None or allowed(t)]
  predictions.sort(key=lambda p: -p.env_steps_per_second)
  best = predictions[0].env_steps_per_second
  near = [p for p in predictions if p.env_steps_per_second >= (1 - margin) * best]
  return min(near, key=lambda p: p.topology.simplicity()), predictions


def command(agent: str, env_id: str, topo: Topology, on_policy: bool = False, deterministic: bool = False) -> str:
  """The launch.train command line, run by this interpreter (relative to here when below here)."""
  python = os.path.relpath(sys.executable)
  python = sys.executable if python.startswith("..") else python
  cmd = f"{python} -m launch.train --agent {agent} --env {env_id} --num_envs {topo.num_envs}"
  if deterministic:  # the seeded buffer: a core install has no Reverb
    cmd += " --deterministic"
  if not on_policy:
    cmd += f" --updates_per_call {topo.updates_per_call}"
  if topo.placement != "embedded":
    cmd += f" --distributed --num_actors {topo.num_actors} --inference {topo.placement}"
  return cmd


def recommendation(t: Topology) -> str:
  """The settings to run, as a sentence: an embedded run has no actors to count (it once read
  `num_actors - (embedded)`) and no inference placement to choose."""
  where = ("embedded (one process: no actors to count, the policy runs in it)" if t.placement == "embedded" else
           f"distributed, num_actors {t.num_actors}, inference {t.placement}")
  return f"recommended: {where}, num_envs {t.num_envs}, updates_per_call {t.updates_per_call}"


def accelerator_advice(host, topo: Topology, distributed: bool = True) -> List[str]:
  """What the host's accelerators (`host`: jrl.accelerators.Accelerators) change in the recommendation of
  `topo`, as lines to print: the figures above are the CPU's; on a GPU host a distributed run's learner
  and inference servers go on the GPUs (jrl.accelerators.place_roles), where a server batches every
  actor's observations in one call, which no CPU measurement prices. `distributed` False: an install
  without the distributed stack, whose runs are embedded (nothing about actors or servers)."""
  from jrl import accelerators
  if not distributed:
    if host.platform == "cpu":
      return ["accelerators: none, the CPU only: the figures above are what runs get."]
    return [f"accelerators: {host.count} {host.platform} device(s). An embedded run keeps the learner on the "
            "accelerator and acts on the CPU or the accelerator by the policy's size (--actor_device auto)."]
  if host.platform == "cpu":
    return ["accelerators: none, the CPU only. Inference stays in the actors (--inference actor): on CPU a "
            "central server reached only 0.53-0.68 of actor-local inference's env-steps/s in jrl's measurements "
            "(docs/performance.md); it pays off here only where the model above says so (cores short, policy "
            "costly)."]
  roles = accelerators.describe(accelerators.place_roles(host, 0, 1, max(1, topo.num_actors)))
  plural = "s" if host.count > 1 else ""
  learner, server = roles["learner"][0], roles["inference"][0]
  where = (f"the learner and an inference server on {learner}, sharing its memory" if learner == server else
           f"the learner on {learner} and an inference server on {server}")
  lines = [f"accelerators: {host.count} {host.platform} device{plural}. A distributed run puts {where} (actors, "
           "replay and the evaluator on the CPU; jrl.accelerators), where the server batches every actor's "
           "observations in one call: the SEED-style placement the figures above (measured on the CPU, where it lost "
           "to actor-local inference, 0.53-0.68) do not price."]
  if topo.placement == "embedded":
    lines.append("An embedded run keeps the learner on the accelerator and acts on the CPU or the accelerator by "
                 "the policy's size (--actor_device auto).")
  elif topo.placement == "actor":
    lines.append(f"With a costly policy (a CNN on frames) try --inference server beside the recommendation: "
                 f"the server's batch of {topo.num_actors} x {topo.num_envs} observations runs on the GPU.")
  if host.count > 1:
    lines.append(f"With {host.count} devices each further inference server gets one of its own "
                 "(--num_inference_servers; the learner keeps the rest, or --learner_devices of them).")
  return lines


def describe(p: Prediction) -> str:
  t = p.topology
  where = "embedded" if t.placement == "embedded" else f"{t.num_actors} actor(s), inference {t.placement}"
  return (f"{where}, {t.num_envs} envs, {t.updates_per_call} updates/call: {p.env_steps_per_second:,.0f} env-steps/s "
          f"({p.bound}-bound)")


# ---------------------------------------------------------------- measuring


WINDOWS = 5  # each figure is the median of this many windows: a busy machine's spikes fall out
REPLAY_HOST = "127.0.0.1"  # the replay process listens here only (launch/loopback.py)


def _per_call(fn: Callable[[], object], seconds: float, timer=None, process=None,
              min_calls: int = 2) -> Dict[str, float]:
  """Seconds per call: "wall", "cpu" (this process, every thread) and each phase of `timer` (a
  PhaseTimer that `fn` keeps), medians over WINDOWS windows; "replay_cpu": the CPU of `process`
  (psutil) over all the windows, as its clock counts in hundredths of seconds."""
  fn()  # compiled / warm
  windows, calls_in_all, replay_cpu = [], 0, _cpu_seconds(process)
  for _ in range(WINDOWS):
    calls, start, cpu = 0, time.perf_counter(), time.process_time()
    if timer is not None:
      timer.start()  # the books start afresh for each window
    while calls < min_calls or time.perf_counter() - start < seconds / WINDOWS:
      fn()
      calls += 1
    window = {"wall": time.perf_counter() - start, "cpu": time.process_time() - cpu}
    if timer is not None:
      timer.stop()
      window.update(timer.totals())
    windows.append({k: v / calls for k, v in window.items()})
    calls_in_all += calls
  out = {k: statistics.median(w.get(k, 0.0) for w in windows) for k in set().union(*windows)}
  out["replay_cpu"] = (_cpu_seconds(process) - replay_cpu) / calls_in_all
  return out


def _cpu_seconds(process) -> float:
  if process is None:
    return 0.0
  times = process.cpu_times()
  return times.user + times.system


class _Replay(NamedTuple):
  """Where the measured actor inserts and the measured learner samples."""
  writer: object                             # insert(block, priority)
  flush: Callable[[], None]
  batches: Callable[[int], Iterator]         # U -> learner batches, fed as the runner feeds them
  process: object = None                     # psutil.Process of a replay process of its own


def _table(reverb, name: str, signature, max_items: int):
  """The measuring table: its sampler never waits on a rate limiter, as in a run that keeps up."""
  return reverb.Table(name, reverb.selectors.Uniform(), reverb.selectors.Fifo(), max_items,
                      reverb.rate_limiters.MinSize(1), signature=signature)


def _reverb_replay(address: str, parts, cfg, mesh, stack: contextlib.ExitStack, process=None) -> _Replay:
  from jrl.experiment.config import ExperimentConfig
  from jrl.experiment.builder import replay_batches
  from jrl.replay import reverb_replay

  replay = reverb_replay.ReverbReplayClient(reverb_replay.reverb.Client(address))
  writer = reverb_replay.ReverbItemWriter(replay.client)
  stack.callback(writer.close)  # before the server stops: it waits (seconds) for open streams
  exp = ExperimentConfig()
  return _Replay(writer, writer.flush, lambda u: replay_batches(
      replay, parts, cfg, dataclasses.replace(exp, updates_per_call=u), cfg.batch_size, mesh), process)


def _seeded_replay(spec, cfg) -> _Replay:
  """The seeded buffer of a --deterministic run: batches drawn in the learner's thread. Sequences
  are kept as a FIFO of items here: a queue would run dry (sampling) or full (inserts) meanwhile."""
  import numpy as np

  from jrl.replay.batches import items_per_fetch, make_assembler
  from jrl.replay.buffer import SeededReplayBuffer

  buffer = SeededReplayBuffer(spec, seed=0, queue=False)

  def batches(u: int) -> Iterator:
    num_items, assemble = items_per_fetch(spec, u, cfg.batch_size), make_assembler(
        spec, u, cfg.batch_size, np.random.default_rng(1))
    while True:
      yield assemble(buffer.sample(num_items))

  return _Replay(buffer, lambda: None, batches)


def _fed_learner(batches: Iterator, make_learner: Callable[[Iterator], object], seconds: float, timer,
                 process) -> Tuple[Dict[str, float], Dict[str, float]]:
  """Figures (`_per_call`) of drawing `batches` alone, then of a learner fed from them. The sampler
  goes on return: a Reverb server stops only once its sampling streams are gone (else in ~5 s)."""
  alone = _per_call(lambda: next(batches), seconds / 2, process=process)
  fed = _per_call(make_learner(batches).step, seconds, timer=timer)
  batches.close()
  return alone, fed


def _serve_replay() -> None:
  """The replay process: serves the table pickled on stdin (name, signature, max_items), says its
  port on stdout, and stops when stdin closes (the advisor is done, or gone)."""
  import reverb
  name, signature, max_items = pickle.load(sys.stdin.buffer)
  server = reverb.Server([_table(reverb, name, signature, max_items)])
  print(server.port, flush=True)
  sys.stdin.buffer.read()
  server.stop()


def _start_replay_process(stack: contextlib.ExitStack) -> subprocess.Popen:
  """A process for `_serve_replay`, bound to loopback as a local launch's nodes are; it loads
  Reverb while this one loads the rest."""
  from launch import loopback
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  child = subprocess.Popen([sys.executable, "-c", "from launch import advise; advise._serve_replay()"], cwd=root,
                           env={**os.environ, **loopback.node_env(REPLAY_HOST)}, stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE)

  def stop():
    child.stdin.close()
    try:
      child.wait(timeout=30)
    except subprocess.TimeoutExpired:
      child.kill()
      child.wait()

  stack.callback(stop)
  return child


def measure(agent_name: str, env_id: str, cfg, seconds: float = 0.5, env_sizes: Sequence[int] = ENV_SIZES,
            policy_sizes: Sequence[int] = POLICY_SIZES, updates: Sequence[int] = UPDATES_PER_CALL,
            log: Callable[[str], None] = print, distributed: bool = True) -> Tuple[Costs, Workload]:
  """Costs of the agent's pieces on this machine, through the library's own shells: with Reverb in
  this process and, if `distributed` (and this install has the distributed stack), in a replay
  process of its own; without Reverb, with the seeded buffer (see the module docstring)."""
  from jrl import compat
  from launch import loopback

  missing = compat.missing_distributed_stack()
  with contextlib.ExitStack() as stack:
    child = None
    if distributed and not missing:
      try:
        child = _start_replay_process(stack)  # first: it loads Reverb while this process loads the rest
      except loopback.ShimUnavailable as e:
        log(f"  no replay process, so no distributed topologies: {e}")

    import jax
    import numpy as np

    from jrl import envs
    from jrl.actors.actor import Actor, LocalPolicy
    from jrl.actors.variables import VariableClient
    from jrl.cpu_jit import jit_per_step
    from jrl.experiment import report
    from jrl.experiment.builder import build_agent_parts, example_item
    from jrl.learners import sharding
    from jrl.learners.learner import Learner
    from jrl.replay.adders import make_block_writer
    from jrl.replay.batches import items_per_fetch

    parts = build_agent_parts(agent_name, env_id, cfg)
    # One actor writes to each replay in turn, so replay keeps whole stacks (a frame-sharing writer
    # would have to see every frame its rows name).
    parts = parts._replace(replay_spec=dataclasses.replace(parts.replay_spec, frame_stack=0))
    spec = parts.replay_spec
    learner_fns = parts.agent.make_learner(parts.networks, cfg)
    params = learner_fns.params(learner_fns.init(jax.random.PRNGKey(0)))
    policy_fns = parts.agent.make_policy(parts.networks, cfg)
    mesh = sharding.make_mesh(1)
    example = example_item(parts, cfg)

    class Source:
      def get_variables(self):
        return params, 0

    # Replay as the embedded runner has it (an in-process Reverb server, or the seeded buffer),
    # then as a distributed program has it (a replay process).
    prefetch = "reverb" not in missing
    if prefetch:
      from jrl.replay import reverb_replay
      signature = reverb_replay.item_signature(example)
      server = reverb_replay.reverb.Server([_table(reverb_replay.reverb, reverb_replay.TABLE, signature,
                                                   spec.max_items)])
      stack.callback(server.stop)
      replays = [_reverb_replay(f"localhost:{server.port}", parts, cfg, mesh, stack)]
    else:
      replays = [_seeded_replay(spec, cfg)]
    if child is not None:
      import psutil  # only here: the replay process's CPU (a core install measures no such process)
      pickle.dump((reverb_replay.TABLE, signature, spec.max_items), child.stdin)
      child.stdin.flush()
      port = child.stdout.readline().strip()
      if not port.isdigit():
        raise RuntimeError(f"the replay process did not start (exit code {child.poll()})")
      replays.append(_reverb_replay(f"{REPLAY_HOST}:{int(port)}", parts, cfg, mesh, stack,
                                    psutil.Process(child.pid)))
    tables = [collections.defaultdict(dict) for _ in replays]  # per replay: Costs field -> table
    notes = ("", " || replay process:")

    env_cost, policy_cost = {}, {}
    for n in env_sizes:
      env = envs.make_vector_env(env_id, n, seed=0)
      timer = report.PhaseTimer()
      sinks = [make_block_writer(spec, r.writer) for r in replays]
      sink = sinks[:1]  # the one the actor writes to now
      actor = Actor(env, LocalPolicy(policy_fns, VariableClient(Source()), jax.random.PRNGKey(1)),
                    adder=spec.make_adder(n), sink=lambda rows: sink[0].add(rows), timer=timer)
      figures = []
      for blocks, replay in zip(sinks, replays):
        sink[0] = blocks
        figures.append(_per_call(actor.step, seconds, timer=timer, process=replay.process))
      env.close()
      policy_cost[n] = figures[0][report.POLICY]
      # env: the env step and the actor's own bookkeeping (everything but policy and insert)
      env_cost[n] = figures[0]["wall"] - policy_cost[n] - figures[0][report.INSERT]
      line = f"  env x{n:<3} {1e3 * env_cost[n]:8.3f} ms/vector step | policy x{n:<3} {1e3 * policy_cost[n]:7.3f} ms |"
      for f, replay, table, note in zip(figures, replays, tables, notes):
        table["insert"][n], table["actor_cpu"][n], table["replay_insert_cpu"][n] = (
            f[report.INSERT], f["cpu"], f["replay_cpu"])
        line += (f"{note} insert {1e3 * f[report.INSERT]:.3f} ms ({1e6 * f[report.INSERT] / n:.1f} us/transition), "
                 f"CPU {1e3 * f['cpu']:.3f} ms")
        line += f" + replay's {1e3 * f['replay_cpu']:.3f} ms" if replay.process is not None else ""
      log(line)

    obs_shape = parts.env_spec.observation_shape
    for b in policy_sizes:
      if b in policy_cost:
        continue
      obs = np.zeros((b,) + obs_shape, parts.env_spec.observation_dtype)
      state, is_first = policy_fns.init(jax.random.PRNGKey(2), b), np.zeros(b, bool)
      select = jit_per_step(policy_fns.select_action)  # as a server at this batch size compiles it
      policy_cost[b] = _per_call(lambda: np.asarray(select(params, obs, is_first, state)[0]), seconds / 2)["wall"]
      log(f"  policy x{b:<4} {1e3 * policy_cost[b]:8.3f} ms/call")

    rng = np.random.default_rng(0)
    for _ in range(max(spec.min_items, items_per_fetch(spec, spec.kind.updates_per_call(max(updates)),
                                                       cfg.batch_size))):
      item = jax.tree_util.tree_map(lambda x: rng.normal(size=np.shape(x)).astype(np.asarray(x).dtype)
                                    if np.issubdtype(np.asarray(x).dtype, np.floating) else np.zeros_like(x), example)
      for replay in replays:
        replay.writer.insert(item, 1.0)
    for replay in replays:
      replay.flush()
    timer = report.PhaseTimer()
    for u in updates:
      if spec.kind.updates_per_call(u) != u:  # an on-policy queue's calls are one batch each
        continue
      line = f"  learner: {u:>2} updates/call"
      for replay, table, note in zip(replays, tables, notes):
        alone, fed = _fed_learner(replay.batches(u), lambda batches: Learner(
            learner_fns, jax.random.PRNGKey(3), batches, mesh=mesh, timer=timer), seconds, timer, replay.process)
        # With prefetching the call's wall time is the learner's (it waits when sampling is slower);
        # without, the sampling in it is the sample figure.
        table["learner"][u] = fed["wall"] - (0.0 if prefetch else fed[report.SAMPLE_WAIT])
        table["learner_cpu"][u], table["sample"][u], table["replay_sample_cpu"][u] = (
            fed["cpu"], alone["wall"], alone["replay_cpu"])
        line += (f"{note} fed {1e3 * fed['wall']:.2f} ms (update {1e3 * fed[report.UPDATE]:.2f}, CPU "
                 f"{1e3 * fed['cpu']:.2f}), sample alone {1e3 * alone['wall']:.2f} ms")
        line += f" + replay's CPU {1e3 * alone['replay_cpu']:.2f}" if replay.process is not None else ""
      log(line)

  cores = float(len(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else float(os.cpu_count() or 1)
  work = Workload(cfg.batch_size, *spec.kind.learner_workload(spec))
  mine = tables[0]
  costs = Costs(env_cost, policy_cost, mine["insert"], mine["learner"], mine["sample"], cores,
                actor_cpu=mine["actor_cpu"], learner_cpu=mine["learner_cpu"], prefetch=prefetch,
                distributed=len(replays) > 1)
  if costs.distributed:
    theirs = tables[1]
    costs = dataclasses.replace(costs, replay_insert_cpu=theirs["replay_insert_cpu"],
                                replay_sample_cpu=theirs["replay_sample_cpu"],
                                **{"remote_" + name: theirs[name] for name in REMOTE})
  return costs, work


def main(argv: Optional[Sequence[str]] = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  from jrl import compat
  from jrl.agents import get_agent
  from jrl.cpu_jit import dispatch_synchronously
  from jrl.envs import check_env_id
  from jrl.errors import ConfigError
  from launch.cli import OneLineParser, add_dataclass_flags, build_config, fail

  dispatch_synchronously()  # measured as runs run (launch.train, node processes)
  pre = argparse.ArgumentParser(add_help=False)
  pre.add_argument("--agent", default="dqn")
  known, _ = pre.parse_known_args(argv)
  try:
    agent = get_agent(known.agent)
  except ConfigError as e:
    fail(PROG, e)
  parser = OneLineParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--agent", default="dqn")
  parser.add_argument("--env", default="CartPole-v1")
  parser.add_argument("--seconds", type=float, default=0.5, help="measuring time per figure")
  parser.add_argument("--cores", type=float, default=None, help="cores to plan for (default: this machine's)")
  parser.add_argument("--max_actors", type=int, default=None, help="largest --num_actors considered (default 2 x cores)")
  parser.add_argument("--rpc_ms", type=float, default=1.0, help="assumed round trip of one request between processes")
  parser.add_argument("--margin", type=float, default=0.15, help="a simpler topology this close to the fastest wins")
  parser.add_argument("--embedded_only", action="store_true", help="consider only embedded runs (no replay process is measured)")
  parser.add_argument("--verbose", action="store_true",
                      help="also show native libraries' info lines (Reverb's '[reverb/cc/...]')")
  add_dataclass_flags(parser, agent.Config, f"agent '{known.agent}'")
  args = parser.parse_args(argv)
  try:
    check_env_id(args.env)
    cfg = build_config(agent.Config, args)
  except ConfigError as e:
    fail(PROG, e)

  missing = compat.missing_distributed_stack()
  if not args.verbose and "reverb" not in missing:
    # Reverb's C++ info lines (servers started and stopped, in this process and the replay one's, which
    # shares this standard error) go straight to file descriptor 2; no logging setting turns them off.
    from launch.quiet import hide_native_chatter
    hide_native_chatter()
  print(f"measuring {args.agent} on {args.env} on this machine ({args.seconds} s per figure)...", flush=True)
  costs, work = measure(args.agent, args.env, cfg, args.seconds, distributed=not args.embedded_only)
  if args.cores is not None:
    costs.cores = args.cores
  costs.rpc = args.rpc_ms / 1e3
  max_actors = args.max_actors or max(1, int(2 * costs.cores))
  best, ranked = recommend(costs, work, max_actors, args.margin)
  load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
  if load > costs.cores:
    print(f"note: this machine is busy (load {load:.1f} on {costs.cores:g} cores): the figures are slower than "
          "on a quiet machine, and a run made later may see another load")
  if missing:
    print(f"distributed topologies need {compat.FULL_STACK_HINT}; this install lacks "
          f"{', '.join(missing)}: embedded runs only" + ("" if costs.prefetch else ", with --deterministic replay"))
  print(f"\n{costs.cores:g} cores; samples_per_insert {work.samples_per_insert:g}, batch {work.batch_size}"
        f"{f', sequences of {work.sequence_length}' if work.sequence_length else ''}; rpc assumed {args.rpc_ms} ms")
  print("fastest predictions (training loop: evaluation, checkpoints and compilation left out):")
  shown = set()
  for p in ranked:
    key = (p.topology.placement, p.topology.num_actors)
    if key in shown:
      continue
    shown.add(key)
    print(f"  {describe(p)}")
    if len(shown) >= 8:
      break
  embedded = max((p for p in ranked if p.topology.placement == "embedded"), key=lambda p: p.env_steps_per_second)
  print(f"  best embedded: {describe(embedded)}")
  from jrl.experiment.config import ExperimentConfig
  defaults = Topology("embedded", 1, ExperimentConfig.num_envs,
                      1 if work.sequence_length else ExperimentConfig.updates_per_call)
  print(f"  the defaults: {describe(predict(costs, work, defaults))}")
  t = best.topology
  print(f"\n{recommendation(t)}")
  print(f"predicted: {best.env_steps_per_second:,.0f} env-steps/s ({best.bound}-bound; limits: "
        + ", ".join(f"{k} {v:,.0f}" for k, v in sorted(best.limits.items(), key=lambda kv: kv[1])) + ")")
  print(f"run it:    {command(args.agent, args.env, t, bool(work.sequence_length), deterministic=not costs.prefetch)}")
  from jrl.accelerators import host_accelerators
  print("\n" + "\n".join(accelerator_advice(host_accelerators(), t, distributed=not missing)))
  return 0


if __name__ == "__main__":
  sys.exit(main())
