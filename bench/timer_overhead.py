"""Overhead of the run report's phase timers (target < 2%), in one run.

(a) the cost of one timer call (enter / switch / exit) against the no-op timer;
(b) the embedded actor (DQN policy, n-step adder, block writer into the seeded buffer)
    and learner calls, each timed with a PhaseTimer and with the default no-op timer,
    in alternating rounds (the median ratio is robust to a busy machine);
(c) the estimate that does not depend on machine noise: timer calls per env step x cost
    per call / measured cost of an env step.

  .venv/bin/python bench/timer_overhead.py [--rounds 7] [--steps 400] [--num_envs 8]
"""

import argparse
import statistics
import time

import jax
import numpy as np

from jrl import envs
from jrl.actors.actor import Actor, LocalPolicy
from jrl.actors.variables import VariableClient
from jrl.agents import dqn
from jrl.learners.learner import Learner
from jrl.replay.adders import BlockWriter, NStepTransitionAdder
from jrl.replay.batches import items_per_call, make_assembler
from jrl.replay.buffer import SeededReplayBuffer
from jrl.timing import NULL_TIMER, PhaseTimer


def per_call_ns(timer, calls: int = 200_000) -> float:
  start = time.perf_counter()
  for _ in range(calls // 4):
    timer.enter("a")
    timer.switch("b")
    timer.switch("c")
    timer.exit()
  return (time.perf_counter() - start) / calls * 1e9


class _Source:
  def __init__(self, params):
    self.params = params

  def get_variables(self):
    return self.params, 0


def build(args, cfg):
  env = envs.make_vector_env(args.env, args.num_envs, seed=0)
  spec = envs.env_spec(env)
  networks = dqn.make_networks(spec, cfg)
  replay_spec = cfg.replay_spec()
  buffer = SeededReplayBuffer(replay_spec, seed=0)
  blocks = BlockWriter(buffer, replay_spec.block_size)
  policy = LocalPolicy(dqn.make_policy(networks, cfg), VariableClient(_Source(networks.init(jax.random.PRNGKey(0)))),
                       jax.random.PRNGKey(1))
  actor = Actor(env, policy, adder=NStepTransitionAdder(args.num_envs, cfg.n_step, cfg.discount), sink=blocks.add)
  for _ in range(replay_spec.min_size // args.num_envs + 1):  # fill replay past min_size
    actor.step()
  assemble = make_assembler(replay_spec, args.updates_per_call, cfg.batch_size, np.random.default_rng(0))
  num_items = items_per_call(args.updates_per_call, cfg.batch_size, replay_spec.block_size)

  def batches():
    while True:
      yield assemble(buffer.sample(num_items))

  learner = Learner(dqn.make_learner(networks, cfg), jax.random.PRNGKey(2), batches())
  return actor, learner


def timed(fn, steps: int):
  """(wall, this thread's CPU) seconds per call. Thread CPU time leaves out the time other
  processes take the CPU from us, the main noise on a shared machine."""
  wall, cpu = time.perf_counter(), time.thread_time()
  for _ in range(steps):
    fn()
  return (time.perf_counter() - wall) / steps, (time.thread_time() - cpu) / steps


def ab(actor, learner, fn, steps: int, rounds: int, control: bool = False):
  """Per call: (wall without timers, median wall ratio, median thread-CPU ratio) of calls
  with a PhaseTimer against calls with the no-op timer, in alternating rounds. `control`:
  both arms without timers (an A/A run: what the machine's noise alone gives)."""
  walls, wall_ratios, cpu_ratios = [], [], []
  for r in range(rounds):
    result = {}
    for timing in ((True, False) if r % 2 == 0 else (False, True)):
      timer = PhaseTimer().start() if timing and not control else NULL_TIMER
      actor.timer = learner.timer = timer
      result[timing] = timed(fn, steps)
    walls.append(result[False][0])
    wall_ratios.append(result[True][0] / result[False][0])
    cpu_ratios.append(result[True][1] / result[False][1])
  actor.timer = learner.timer = NULL_TIMER
  return statistics.median(walls), statistics.median(wall_ratios), statistics.median(cpu_ratios)


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--env", default="CartPole-v1")
  parser.add_argument("--num_envs", type=int, default=8)
  parser.add_argument("--steps", type=int, default=400, help="calls per round")
  parser.add_argument("--rounds", type=int, default=11)
  parser.add_argument("--updates_per_call", type=int, default=4)
  args = parser.parse_args()
  cfg = dqn.Config(min_replay_size=500)

  timer_ns = per_call_ns(PhaseTimer().start())
  null_ns = per_call_ns(NULL_TIMER)
  print(f"(a) one timer call: PhaseTimer {timer_ns:.0f} ns | no-op timer {null_ns:.0f} ns")

  actor, learner = build(args, cfg)
  actor.step(), learner.step()  # compiled
  learner_steps = max(50, args.steps // 4)
  a_off, a_wall, a_cpu = ab(actor, learner, actor.step, args.steps, args.rounds)
  l_off, l_wall, l_cpu = ab(actor, learner, learner.step, learner_steps, args.rounds)
  _, a_wall0, a_cpu0 = ab(actor, learner, actor.step, args.steps, args.rounds, control=True)
  _, l_wall0, l_cpu0 = ab(actor, learner, learner.step, learner_steps, args.rounds, control=True)
  print(f"(b) with timers / without, medians of {args.rounds} alternating rounds [A/A control: no timers in "
        f"either arm]: actor step ({args.num_envs} envs, {a_off * 1e6:.0f} us) wall {a_wall - 1:+.1%} "
        f"[{a_wall0 - 1:+.1%}], thread CPU {a_cpu - 1:+.1%} [{a_cpu0 - 1:+.1%}] | learner call "
        f"({l_off * 1e6:.0f} us) wall {l_wall - 1:+.1%} [{l_wall0 - 1:+.1%}], thread CPU {l_cpu - 1:+.1%} "
        f"[{l_cpu0 - 1:+.1%}]")

  # Timer calls the embedded runner makes: per vector step, the actor's 4; per learner call
  # 3, +3 sampling the seeded buffer, +2 copying the new parameters; learner calls per vector
  # step at the DQN defaults: num_envs env steps x samples_per_insert / (updates_per_call x batch).
  calls_per_step = args.num_envs * cfg.samples_per_insert / (args.updates_per_call * cfg.batch_size)
  timer_calls = 4 + 8 * calls_per_step
  per_step = timer_calls * (timer_ns - null_ns) * 1e-9
  step_cost = a_off + calls_per_step * l_off
  print(f"(c) estimate for the embedded runner (DQN defaults, updates_per_call {args.updates_per_call}): "
        f"{timer_calls:.0f} timer calls per vector step x {timer_ns - null_ns:.0f} ns = "
        f"{per_step * 1e6:.1f} us of a {step_cost * 1e6:.0f} us vector step: overhead {per_step / step_cost:.2%} "
        f"(target < 2%)")


if __name__ == "__main__":
  main()
