"""Topology advisor: measures this machine, then recommends how to run an agent on it.

  python -m launch.advise --agent dqn --env CartPole-v1 [--seconds 0.5] [--cores N] [--max_actors N]
                          [--rpc_ms 1.0] [--any_agent_field VALUE ...]

It measures, with the library's own pieces (the actor shell and its phase timer, the jitted
policy, the learner shell, Reverb inserts and the sampler), on this machine:

  env        seconds per vector step of n envs, for several n (env bookkeeping included)
  policy     seconds per policy call on a batch of b observations, for several b
  insert     seconds per vector step of n envs through the n-step adder, the block writer
             and Reverb inserts
  learner    seconds per learner call of U updates fed from Reverb through the prefetch
             thread, as the runner feeds it (wall and CPU), and per sample (+ batch assembly
             and placement) of one call's items alone, for several U

and predicts the env-steps/s of the training loop (evaluation, checkpoints and compilation
left out) for each candidate topology: embedded (one process), or --distributed with A
actors running the policy themselves (--inference actor) or asking a batched server
(--inference server), each with n envs per actor and U updates per learner call. The agent's
samples_per_insert is kept: it is part of the algorithm, not of the topology.

The model (`predict`, pure, tested on hand-made costs) per env step:

  embedded   main thread:  (env(n) + policy(n)) / n + insert + c(U) * learner(U)
             prefetch thread: c(U) * sample(U), in parallel when there are 2+ cores
  actor      A actors each (env(n) + policy(n)) / n + insert, in parallel; the learner
             bounds the rate at 1 / (c(U) * max(learner(U), sample(U))); all of it shares the cores
  server     actors wait env(n) + rpc + policy(A n) per vector step; the server's batch is
             every actor's request (A n observations)

where c(U) = samples_per_insert / (U * batch_size) learner calls per env step (on-policy
agents: one call per batch_size sequences of sequence_length steps). CPU: the sum of the
work per env step over all processes cannot exceed the cores (less a quarter core for the
replay, counter and evaluator processes of a distributed program). `rpc` is not measured
(courier and TensorFlow are heavy to load): --rpc_ms, 1 ms by default, of which each end
spends a quarter on the CPU. The server pays off where CPU is short and the policy is
costly: it computes once per batch what every actor would compute.

The recommendation is the fastest prediction, except that a simpler topology (embedded
before distributed, fewer actors, fewer envs, fewer updates per call) within --margin
(15%) of it wins: the model leaves out the costs distribution adds (process start-up,
parameter fetches, serialisation).
"""

import argparse
import dataclasses
import math
import os
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

PROG = "python -m launch.advise"
ENV_SIZES = (1, 2, 4, 8, 16, 32, 64)
POLICY_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
UPDATES_PER_CALL = (1, 2, 4, 8, 16)
ACTOR_COUNTS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
SIDE_PROCESSES_CORES = 0.25  # replay, counter and evaluator of a distributed program, between evaluations
PLACEMENT_ORDER = {"embedded": 0, "actor": 1, "server": 2}
RPC_CPU_SHARE = 0.25  # CPU each end spends per request, as a share of the round trip (assumed)


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
    if costs.cores < 2:  # no core for the prefetch thread: sampling adds to the main thread's work
      main["replay"] = sample
    serial = sum(main.values())
    limits = {k: 1.0 / v for k, v in main.items() if v > 0}
    if costs.cores >= 2:  # the prefetch thread samples while the main thread works
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
  if topo.placement == "actor":
    policy = at(costs.policy, n) / n
    actor_step = env + policy + insert
    limits["env" if env >= policy + insert else ("policy" if policy >= insert else "insert")] = a / actor_step
    cpu = at(costs.actor_cpu or _sum(costs.env, costs.policy, costs.insert), n) / n + learner_cpu
  elif topo.placement == "server":
    batch = a * n
    server_call = at(costs.policy, batch)
    actor_step = (at(costs.env, n) + costs.rpc + server_call) / n + insert
    limits["env" if env >= (costs.rpc + server_call) / n else "server"] = a / actor_step
    limits["server"] = min(limits.get("server", math.inf), batch / (server_call + costs.rpc))
    # Each request costs CPU on both ends (RPC_CPU_SHARE of its round trip each); the
    # server computes once per batch.
    actor_cpu = at(costs.actor_cpu or _sum(costs.env, costs.policy, costs.insert), n) - at(costs.policy, n)
    cpu = actor_cpu / n + server_call / batch + 2 * RPC_CPU_SHARE * costs.rpc / n + learner_cpu
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
  for a in ACTOR_COUNTS:
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


def command(agent: str, env_id: str, topo: Topology, on_policy: bool = False) -> str:
  cmd = f".venv/bin/python -m launch.train --agent {agent} --env {env_id} --num_envs {topo.num_envs}"
  if not on_policy:
    cmd += f" --updates_per_call {topo.updates_per_call}"
  if topo.placement != "embedded":
    cmd += f" --distributed --num_actors {topo.num_actors} --inference {topo.placement}"
  return cmd


def describe(p: Prediction) -> str:
  t = p.topology
  where = "embedded" if t.placement == "embedded" else f"{t.num_actors} actor(s), inference {t.placement}"
  return (f"{where}, {t.num_envs} envs, {t.updates_per_call} updates/call: {p.env_steps_per_second:,.0f} env-steps/s "
          f"({p.bound}-bound)")


# ---------------------------------------------------------------- measuring


WINDOWS = 5  # each figure is the median of this many windows: a busy machine's spikes fall out


def _per_call(fn: Callable[[], object], seconds: float, min_calls: int = 2) -> Tuple[float, float]:
  """(wall, process CPU) seconds per call, medians over WINDOWS windows; the CPU time
  counts every thread of the process."""
  fn()  # compiled / warm
  walls, cpus = [], []
  for _ in range(WINDOWS):
    calls, start, cpu = 0, time.perf_counter(), time.process_time()
    while calls < min_calls or time.perf_counter() - start < seconds / WINDOWS:
      fn()
      calls += 1
    walls.append((time.perf_counter() - start) / calls)
    cpus.append((time.process_time() - cpu) / calls)
  return statistics.median(walls), statistics.median(cpus)


def measure(agent_name: str, env_id: str, cfg, seconds: float = 0.5, env_sizes: Sequence[int] = ENV_SIZES,
            policy_sizes: Sequence[int] = POLICY_SIZES, updates: Sequence[int] = UPDATES_PER_CALL,
            log: Callable[[str], None] = print) -> Tuple[Costs, Workload]:
  """Costs of the agent's pieces on this machine, through the library's own shells."""
  import jax
  import numpy as np

  from jrl import envs
  from jrl.actors.actor import Actor, LocalPolicy
  from jrl.actors.variables import VariableClient
  from jrl.experiment import report
  from jrl.experiment.builder import build_agent_parts, example_item, items_per_fetch, make_adder, make_assembler
  from jrl.replay.adders import make_block_writer
  from jrl.learners import sharding
  from jrl.learners.learner import Learner
  from jrl.experiment.config import ExperimentConfig
  from jrl.replay import reverb_replay
  from jrl.replay.batches import PrefetchIterator
  from jrl.replay.buffer import SeededReplayBuffer

  parts = build_agent_parts(agent_name, env_id, cfg)
  spec = parts.replay_spec
  learner_fns = parts.agent.make_learner(parts.networks, cfg)
  params = learner_fns.params(learner_fns.init(jax.random.PRNGKey(0)))
  policy_fns = parts.agent.make_policy(parts.networks, cfg)

  class Source:
    def get_variables(self):
      return params, 0

  # Reverb as the embedded runner has it: an in-process server, the item writer, the sampler.
  example = example_item(parts, cfg)
  table = reverb_replay.reverb.Table(reverb_replay.TABLE, reverb_replay.reverb.selectors.Uniform(),
                                     reverb_replay.reverb.selectors.Fifo(), spec.max_items,
                                     reverb_replay.reverb.rate_limiters.MinSize(1),
                                     signature=reverb_replay.item_signature(example))
  server = reverb_replay.reverb.Server([table])
  address = f"localhost:{server.port}"
  writer = reverb_replay.ReverbItemWriter(reverb_replay.reverb.Client(address))

  env_cost, insert_cost, actor_cpu = {}, {}, {}
  policy_cost: Dict[int, float] = {}
  for n in env_sizes:
    env = envs.make_vector_env(env_id, n, seed=0)
    timer = report.PhaseTimer()
    blocks = make_block_writer(spec, writer)
    actor = Actor(env, LocalPolicy(policy_fns, VariableClient(Source()), jax.random.PRNGKey(1)),
                  adder=make_adder(spec, n, cfg), sink=blocks.add, timer=timer)
    actor.step()  # compiles the policy for this batch
    windows = []
    for _ in range(WINDOWS):
      steps, start, cpu = 0, time.perf_counter(), time.process_time()
      timer.start()  # the books start after the compile, afresh for each window
      while steps < 2 or time.perf_counter() - start < seconds / WINDOWS:
        actor.step()
        steps += 1
      timer.stop()
      phases = timer.totals()
      policy, insert = phases.get(report.POLICY, 0.0), phases.get(report.INSERT, 0.0)
      # env: the env step and the actor's own bookkeeping (everything but policy and insert)
      windows.append(((timer.wall() - policy - insert) / steps, policy / steps, insert / steps,
                      (time.process_time() - cpu) / steps))
    env_cost[n], policy_cost[n], insert_cost[n], actor_cpu[n] = (statistics.median(w[i] for w in windows)
                                                                 for i in range(4))
    env.close()
    log(f"  env x{n:<3} {1e3 * env_cost[n]:8.3f} ms/vector step | policy x{n:<3} {1e3 * policy_cost[n]:7.3f} ms | "
        f"insert {1e3 * insert_cost[n]:7.3f} ms ({1e6 * insert_cost[n] / n:.1f} us/transition) | "
        f"CPU {1e3 * actor_cpu[n]:.3f} ms")
  writer.flush()

  select = jax.jit(policy_fns.select_action)
  obs_shape = parts.env_spec.observation_shape
  for b in policy_sizes:
    if b in policy_cost:
      continue
    obs = np.zeros((b,) + obs_shape, parts.env_spec.observation_dtype)
    state, is_first = policy_fns.init(jax.random.PRNGKey(2), b), np.zeros(b, bool)
    policy_cost[b] = _per_call(lambda: np.asarray(select(params, obs, is_first, state)[0]), seconds / 2)[0]
    log(f"  policy x{b:<4} {1e3 * policy_cost[b]:8.3f} ms/call")

  # Learner calls on batches assembled from replay, placed as the runner places them.
  mesh = sharding.make_mesh(1)
  buffer = SeededReplayBuffer(spec, seed=0)
  rng = np.random.default_rng(0)
  fill = max(spec.min_items, items_per_fetch(spec, max(updates), cfg.batch_size))
  for _ in range(fill):
    item = jax.tree_util.tree_map(lambda x: rng.normal(size=np.shape(x)).astype(np.asarray(x).dtype)
                                  if np.issubdtype(np.asarray(x).dtype, np.floating) else np.zeros_like(x), example)
    buffer.insert(item, 1.0)
    writer.insert(item, 1.0)
  writer.flush()
  learner_cost, sample_cost, learner_cpu = {}, {}, {}
  for u in updates:
    if spec.sequences and u != 1:
      continue
    num_items = items_per_fetch(spec, u, cfg.batch_size)
    assemble = make_assembler(spec, u, cfg.batch_size, np.random.default_rng(1))
    prepared = assemble(buffer.sample(num_items))
    prepared = prepared._replace(batch=sharding.put_batch(prepared.batch, mesh))

    def forever():
      while True:
        yield prepared

    bare = Learner(learner_fns, jax.random.PRNGKey(3), forever(), mesh=mesh)
    bare_cost = _per_call(bare.step, seconds / 2)[0]
    sampler = reverb_replay.ReverbItemSampler(address, num_items, example)
    place = lambda: prepared._replace(batch=sharding.put_batch(assemble(sampler.sample()).batch, mesh))
    sample_cost[u] = _per_call(place, seconds / 2)[0]
    # As the runner feeds it: batches sampled, assembled and placed on the prefetch thread.
    batches = PrefetchIterator(place, depth=ExperimentConfig.prefetch)
    fed = Learner(learner_fns, jax.random.PRNGKey(3), batches, mesh=mesh)
    learner_cost[u], learner_cpu[u] = _per_call(fed.step, seconds)
    batches.close()
    log(f"  learner: {u:>2} updates/call fed from Reverb {1e3 * learner_cost[u]:7.2f} ms (CPU "
        f"{1e3 * learner_cpu[u]:.2f}; bare update {1e3 * bare_cost:.2f}) | sample alone {1e3 * sample_cost[u]:.2f} ms")
  server.stop()
  cores = float(len(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else float(os.cpu_count() or 1)
  rows_per_step = 1.0 / spec.replay_sequence_period if spec.replayed_sequences else 1.0  # R2D2: a sequence per period
  work = Workload(cfg.batch_size, 1.0 if spec.sequences else float(spec.samples_per_insert) * rows_per_step,
                  spec.sequence_length)
  return Costs(env_cost, policy_cost, insert_cost, learner_cost, sample_cost, cores, actor_cpu=actor_cpu,
               learner_cpu=learner_cpu), work


def main(argv: Optional[Sequence[str]] = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  from jrl.agents import get_agent
  from jrl.envs import check_env_id
  from jrl.errors import ConfigError
  from launch.cli import OneLineParser, add_dataclass_flags, build_config, fail

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
  parser.add_argument("--embedded_only", action="store_true", help="consider only embedded runs")
  add_dataclass_flags(parser, agent.Config, f"agent '{known.agent}'")
  args = parser.parse_args(argv)
  try:
    check_env_id(args.env)
    cfg = build_config(agent.Config, args)
  except ConfigError as e:
    fail(PROG, e)

  print(f"measuring {args.agent} on {args.env} on this machine ({args.seconds} s per figure)...", flush=True)
  costs, work = measure(args.agent, args.env, cfg, args.seconds)
  if args.cores is not None:
    costs.cores = args.cores
  costs.rpc = args.rpc_ms / 1e3
  max_actors = args.max_actors or max(1, int(2 * costs.cores))
  allowed = (lambda t: t.placement == "embedded") if args.embedded_only else None
  best, ranked = recommend(costs, work, max_actors, args.margin, allowed)
  load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
  if load > costs.cores:
    print(f"note: this machine is busy (load {load:.1f} on {costs.cores:g} cores): the figures are slower than "
          "on a quiet machine, and a run made later may see another load")
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
  print(f"\nrecommended: num_actors {t.num_actors if t.placement != 'embedded' else '- (embedded)'}, num_envs "
        f"{t.num_envs}, inference {'in the process' if t.placement == 'embedded' else t.placement}, "
        f"updates_per_call {t.updates_per_call}")
  print(f"predicted: {best.env_steps_per_second:,.0f} env-steps/s ({best.bound}-bound; limits: "
        + ", ".join(f"{k} {v:,.0f}" for k, v in sorted(best.limits.items(), key=lambda kv: kv[1])) + ")")
  print(f"run it:    {command(args.agent, args.env, t, on_policy=bool(work.sequence_length))}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
