"""Throughput of the embedded pieces, each against its bare baseline, in one run.

(a) actor env-steps/s (policy, n-step adder and Reverb inserts; as in Reverb runs, the
    policy for the next step dispatched before this step's inserts where dispatch is
    asynchronous) vs raw
    stepping of the same vector env with random actions, and where the actor's
    time goes (microseconds per vector step, by phase); then the actor with its envs in
    `--env_groups` groups taking turns against one group;
(b) learner updates/s fed from Reverb (sampling, cross-item shuffle, device
    prefetch) vs the bare jitted update loop on a fixed device batch, and the learner
    shell on that fixed batch (its own cost, without the feed), all three in alternating slices.

  .venv/bin/python bench/embedded_throughput.py [--seconds 5] [--num_envs 8] ...

JAX dispatches CPU programs as runs do (`jrl.cpu_jit`: synchronously, asynchronously for image
observations); JRL_CPU_ASYNC_DISPATCH=1 measures JAX's asynchronous dispatch everywhere, =0
synchronous dispatch everywhere. `--env MinAtar/Breakout-v1` or `ALE/Breakout-v5` measure the
actor with DQN's CNN.
"""

import argparse
import itertools
import time

import distrax  # noqa: F401  (before reverb: see jrl/replay/reverb_replay.py)
import jax
import numpy as np

from jrl import cpu_jit, envs
from jrl.actors.actor import Actor, LocalPolicy
from jrl.actors.variables import VariableClient
from jrl.agents import dqn
from jrl.experiment import builder
from jrl.experiment.builder import build_agent_parts, env_spec_of, example_transition, make_actor
from jrl.experiment.config import ExperimentConfig
from jrl.learners import sharding
from jrl.learners.learner import Learner, make_multi_update
from jrl.replay import reverb_replay
from jrl.replay.adders import BlockWriter, NStepTransitionAdder
from jrl.replay.batches import items_per_call
from jrl.timing import PhaseTimer

reverb = reverb_replay.reverb


class _StaticSource:
  def __init__(self, params):
    self._params = params

  def get_variables(self):
    return self._params, 0


def _rate(fn, seconds: float, unit_per_call: int) -> float:
  fn()  # warm-up: compilation, and again for inputs the first call placed (committed to a device)
  fn()
  calls, start = 0, time.perf_counter()
  while time.perf_counter() - start < seconds:
    fn()
    calls += 1
  return calls * unit_per_call / (time.perf_counter() - start)


def _interleaved_rates(fns, seconds: float, unit_per_call: int, rounds: int = 5):
  """Rates of several loops measured in alternating slices, so that each sees the same
  machine load (a shared machine's load drifts over seconds)."""
  for fn in fns:
    fn()  # warm-up (compilation)
  calls, spent = [0] * len(fns), [0.0] * len(fns)
  for _ in range(rounds):
    for i, fn in enumerate(fns):
      start = time.perf_counter()
      while time.perf_counter() - start < seconds / rounds:
        fn()
        calls[i] += 1
      spent[i] += time.perf_counter() - start
  return [c * unit_per_call / t for c, t in zip(calls, spent)]


def _server(env_spec, block_size: int, max_items: int):
  step = example_transition(env_spec)
  signature = reverb_replay.item_signature(type(step)(*[np.zeros((block_size,) + np.shape(x), np.asarray(x).dtype)
                                                         for x in step]))
  table = reverb.Table(reverb_replay.TABLE, reverb.selectors.Uniform(), reverb.selectors.Fifo(), max_items,
                       reverb.rate_limiters.MinSize(1), signature=signature)
  server = reverb.Server([table])
  return server, f"localhost:{server.port}"


def bench_actor(args, cfg):
  env = envs.make_vector_env(args.env, args.num_envs, seed=0)
  env_spec = envs.env_spec(env)
  raw_env = envs.make_vector_env(args.env, args.num_envs, seed=0)
  raw_env.reset(seed=0)

  networks = dqn.make_networks(env_spec, cfg)
  server, address = _server(env_spec, cfg.block_size, 1_000_000)
  writer = reverb_replay.ReverbItemWriter(reverb.Client(address))
  blocks = BlockWriter(writer, cfg.block_size)
  policy = LocalPolicy(dqn.make_policy(networks, cfg),
                       VariableClient(_StaticSource(networks.init(jax.random.PRNGKey(0))), 10**9), jax.random.PRNGKey(1))
  timer = PhaseTimer()
  actor = Actor(env, policy, adder=NStepTransitionAdder(args.num_envs, cfg.n_step, cfg.discount),
                sink=blocks.add, timer=timer,
                dispatch_ahead=not args.no_dispatch_ahead and cpu_jit.dispatches_asynchronously())
  for _ in range(50):  # compile, fill the n-step windows
    actor.step()
  timer.start()
  steps_before = actor.env_steps
  def raw_step():
    with timer.phase("raw"):  # not the actor's time: left out of its phases below
      raw_env.step(raw_env.action_space.sample())

  raw, full = _interleaved_rates([raw_step, actor.step], 2 * args.seconds, args.num_envs)
  timer.stop()
  vector_steps = (actor.env_steps - steps_before) / args.num_envs
  phases = {k: 1e6 * v / vector_steps for k, v in sorted(timer.totals().items(), key=lambda kv: -kv[1])
            if k != "raw"}
  writer.flush()
  items = writer.items_inserted
  server.stop()
  return raw, full, items, phases


def bench_env_groups(args, cfg):
  """The full actor with its envs in `args.env_groups` groups taking turns (`GroupedActor`:
  each group's next actions computed while the others step) against one group, same envs."""
  parts = build_agent_parts("dqn", args.env, cfg)
  params = parts.networks.init(jax.random.PRNGKey(0))
  server, address = _server(parts.env_spec, cfg.block_size, 200_000)
  writer = reverb_replay.ReverbItemWriter(reverb.Client(address))
  ahead = not args.no_dispatch_ahead and cpu_jit.dispatches_asynchronously()
  actors = []
  for groups in (1, args.env_groups):
    exp = ExperimentConfig(env=args.env, num_envs=args.num_envs, env_groups=groups)
    source = (VariableClient(_StaticSource(params), 10**9), jax.random.PRNGKey(1), None)
    actors.append(make_actor(exp, parts, cfg, source, 0, BlockWriter(writer, cfg.block_size).add, None, ahead))
  for _ in range(20):  # compile
    for actor in actors:
      actor.step()
  rates = _interleaved_rates([actor.step for actor in actors], 2 * args.seconds, args.num_envs)
  server.stop()
  return rates


def bench_learner(args, cfg, updates_per_call: int):
  env = envs.make_vector_env(args.env, 1, seed=0)
  env_spec = envs.env_spec(env)
  networks = dqn.make_networks(env_spec, cfg)
  fns = dqn.make_learner(networks, cfg)
  num_items = items_per_call(updates_per_call, cfg.batch_size, cfg.block_size)

  server, address = _server(env_spec, cfg.block_size, 100_000)
  client = reverb.Client(address)
  writer = reverb_replay.ReverbItemWriter(client)
  rng = np.random.default_rng(0)
  example = example_transition(env_spec)
  for _ in range(20_000 // cfg.block_size):
    block = type(example)(*[rng.normal(size=(cfg.block_size,) + np.shape(x)).astype(np.asarray(x).dtype)
                            for x in example])
    writer.insert(block._replace(action=rng.integers(0, 2, cfg.block_size).astype(np.int32)), 1.0)
  writer.flush()

  mesh = sharding.make_mesh(1)
  # The runner's own prefetch path: sample, pool and deal, place sharded on the mesh.
  exp = ExperimentConfig(env=args.env, updates_per_call=updates_per_call, prefetch=args.prefetch)
  parts = build_agent_parts("dqn", args.env, cfg)
  prefetch_timer = PhaseTimer()
  batches = builder.replay_batches(reverb_replay.ReverbReplayClient(client), parts, cfg, exp, cfg.batch_size, mesh,
                                   timer=prefetch_timer)
  learner = Learner(fns, jax.random.PRNGKey(0), batches, mesh=mesh)
  learner.step()
  learner.step()
  # The prefetch thread's phases, from the fed loop running alone (the thread owns its timer: difference it).
  calls_before, before = learner.version, prefetch_timer.totals()
  _rate(learner.step, args.seconds / 2, updates_per_call)
  after = prefetch_timer.totals()
  phases = {k: 1e3 * (v - before.get(k, 0.0)) / (learner.version - calls_before)
            for k, v in sorted(after.items(), key=lambda kv: -kv[1])}

  prepared = next(batches)
  fixed = prepared.batch
  update_many = jax.jit(make_multi_update(fns.update))
  state = [fns.init(jax.random.PRNGKey(0))]

  def bare_step():
    state[0], metrics = update_many(state[0], fixed)
    jax.block_until_ready(metrics["loss"])

  # The learner shell (metrics fetch, bookkeeping) on that same batch, without any sampling:
  # what separates `fed` from `bare` that is not the feed.
  shell = Learner(fns, jax.random.PRNGKey(0), itertools.repeat(prepared), mesh=mesh)
  # All three in alternating slices, as the actor's figures: the box's speed drifts over seconds
  # (the bare loop alone ran 2.4k-3.0k updates/s from one run to the next). A fed slice starts on
  # the prefetch queue the thread refilled meanwhile (`--prefetch` calls, ~0.5% of a slice).
  bare, shell_rate, fed = _interleaved_rates([bare_step, shell.step, learner.step], 3 * args.seconds,
                                             updates_per_call)
  batches.close()
  server.stop()
  return bare, shell_rate, fed, num_items, phases


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--env", default="CartPole-v1")
  parser.add_argument("--num_envs", type=int, default=8)
  parser.add_argument("--seconds", type=float, default=5.0, help="measuring time per figure")
  parser.add_argument("--batch_size", type=int, default=256)
  parser.add_argument("--hidden_sizes", default="64,64")
  parser.add_argument("--block_size", type=int, default=32)
  parser.add_argument("--updates_per_call", default="1,4,16")
  parser.add_argument("--prefetch", type=int, default=2)
  parser.add_argument("--env_groups", type=int, default=2,
                      help="also measure the actor with its envs in this many groups against one group (1: skip)")
  parser.add_argument("--no_dispatch_ahead", action="store_true",
                      help="the actor asks for actions after its inserts (it does so anyway with synchronous dispatch)")
  args = parser.parse_args()
  cpu_jit.dispatch_synchronously()
  synchronous = not cpu_jit.choose_dispatch(env_spec_of(args.env).observation_shape)  # as runs choose
  cfg = dqn.Config(batch_size=args.batch_size, block_size=args.block_size,
                   hidden_sizes=tuple(int(h) for h in args.hidden_sizes.split(",")))

  print(f"jax devices: {jax.devices()}; {args.env}, {args.num_envs} envs, block {cfg.block_size}, "
        f"DQN torso {cfg.torso} (hidden {cfg.hidden_sizes}), batch {cfg.batch_size}, "
        f"{'synchronous' if synchronous else 'asynchronous'} CPU dispatch")
  raw, full, items, phases = bench_actor(args, cfg)
  print(f"(a) actor: raw vector env {raw:,.0f} env-steps/s | full actor (policy + adder + Reverb) "
        f"{full:,.0f} env-steps/s | ratio {full / raw:.2f} (target >= 0.5) | {items} items inserted")
  print("    actor us per vector step: " + ", ".join(f"{k} {v:.0f}" for k, v in phases.items()))
  if args.env_groups > 1:
    one, grouped = bench_env_groups(args, cfg)
    print(f"(a) actor with its envs in {args.env_groups} groups (--env_groups {args.env_groups}) {grouped:,.0f} "
          f"env-steps/s | one group {one:,.0f} | ratio {grouped / one:.2f}")
  for u in (int(x) for x in args.updates_per_call.split(",")):
    bare, shell, fed, num_items, phases = bench_learner(args, cfg, u)
    print(f"(b) learner, {u:>2} updates/call: bare jitted {bare:,.0f} updates/s | fed from Reverb {fed:,.0f} updates/s "
          f"({fed * cfg.batch_size:,.0f} samples/s) | ratio {fed / bare:.2f} (target >= 0.8)")
    print(f"    learner shell on one fixed batch (no sampling) {shell:,.0f} updates/s: {shell / bare:.2f} of bare")
    print(f"    prefetch thread ms per call ({num_items} items): " + ", ".join(f"{k} {v:.2f}" for k, v in phases.items()))


if __name__ == "__main__":
  main()
