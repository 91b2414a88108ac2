"""PPO on CartPole to the 475 threshold: the device backend against the embedded Reverb runner.

  .venv/bin/python bench/device_loop.py [--seed 0] [--max_steps 300000] [--eval_every 5000]

In one invocation, each run in its own process (the device run is the "Anakin" shape: many
envs, one batch of trajectories per rollout; the embedded run keeps PPO's defaults):
  (a)  `--backend device` on gymnax:CartPole-v1 (num_envs = batch_size = --device_envs), with a
       fresh persistent compilation cache, then (a2) the identical run again on that cache;
  (b)  the embedded runner (Python CartPole-v1 envs, in-process Reverb queue), PPO defaults;
  raw: gymnax's random-policy rollout (jit + vmap + scan) with the same number of envs, and
       the same rollout acting with PPO's policy network.
For each run: compile time (JAX's trace + lower + backend compile events), time to the
threshold excluding compilation (from the loop's first env step to the end of the evaluation
that reached it, evaluations included, compiles inside it subtracted), env-steps/s (steps to
threshold / that time) and the steady-state rate of acting + learning alone, then the ratios
against the targets: (a) env-steps/s >= 30x (b); (a) time to threshold <= 1/10 of (b); the
device loop (acting + learning, without evaluation) >= 0.3 of the raw random rollout.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

THRESHOLD = 475.0


def device_agent_args(envs: int):
  return {"batch_size": envs, "sequence_length": 16, "num_minibatches": 8, "num_epochs": 4}


def run_one(kind: str, args, out_path: str) -> None:
  """Runs one experiment in this process and writes its figures to out_path."""
  import rlax, distrax  # noqa: F401,E401 - before TensorFlow (reverb), as the test suite does
  import jax
  from jrl.agents import ppo
  from jrl.run.device.runner import CompileClock, run_device
  from jrl.experiment.config import ExperimentConfig

  run_dir = tempfile.mkdtemp(prefix=f"bench-{kind}-")
  common = dict(agent="ppo", seed=args.seed, steps=args.max_steps, stop_at_threshold=True,
                eval_every=args.eval_every, reward_threshold=THRESHOLD, progress_seconds=0,
                run_dir=os.path.join(run_dir, "run"), checkpoint_every_seconds=0)
  clock = CompileClock()
  t0 = time.monotonic()
  loop_start = []
  if kind == "device":
    exp = ExperimentConfig(env="gymnax:CartPole-v1", backend="device", num_envs=args.device_envs, **common)
    summary = run_device(exp, ppo.Config(**device_agent_args(args.device_envs)))
    loop_start.append(t0 + summary["details"]["setup_seconds"])  # its loop compiles nothing (ahead of time)
  else:
    from jrl.run import embedded as runner

    class MarkLoopStart(runner.CheckpointSchedule):  # made right before the runner's loop clock starts
      def __init__(self, *a, **k):
        super().__init__(*a, **k)
        loop_start.append(time.monotonic())

    runner.CheckpointSchedule = MarkLoopStart
    exp = ExperimentConfig(env="CartPole-v1", **common)
    summary = runner.run(exp, ppo.Config())
  wall = time.monotonic() - t0
  clock.active = False
  import csv
  with open(os.path.join(summary["run_dir"], "metrics", "evaluator.csv")) as f:
    evals = list(csv.DictReader(f))
  reached = [float(r["wall_seconds"]) for r in evals if float(r["eval_return"]) >= THRESHOLD]
  # From the loop's first env step to the end of the evaluation that reached the threshold,
  # less the compiles inside that span (the embedded runner compiles lazily, in its loop).
  row_wall = reached[0] if reached else None
  if row_wall is not None:
    t_end = (t0 + row_wall) if kind == "device" else (loop_start[0] + row_wall)
    compute = t_end - loop_start[0] - clock.seconds_between(loop_start[0], t_end)
  else:
    compute = None
  import numpy as np
  with open(os.path.join(summary["run_dir"], "metrics", "actor.csv")) as f:
    rates = [float(r["steps_per_second"]) for r in csv.DictReader(f)]
  # Steady state: the device loop's own rate (acting + learning, no evaluation, no compile);
  # for the embedded runner the median of its per-row rates (acting + learning between rows).
  steady = summary["rates"]["env_steps_per_second"] if kind == "device" else float(np.median(rates[1:] or rates))
  figures = {"kind": kind, "wall": wall, "compile": clock.seconds,
             "backend_compile": clock.by_event.get("/jax/core/compile/backend_compile_duration", 0.0),
             "time_to_threshold": compute,
             "steps": summary["actor_steps"], "steps_to_threshold": summary["steps_to_threshold"],
             "best_eval_return": summary["best_eval_return"],
             "env_steps_per_second": summary["steps_to_threshold"] / compute if compute else float("nan"),
             "steady_env_steps_per_second": steady, "devices": jax.device_count()}
  with open(out_path, "w") as f:
    json.dump(figures, f)


def subprocess_run(kind: str, args, cache_dir: str) -> dict:
  out = tempfile.mktemp(suffix=".json")
  env = dict(os.environ, JRL_JAX_CACHE=cache_dir, PYTHONPATH=ROOT)
  cmd = [sys.executable, os.path.abspath(__file__), "--_run", kind, "--_out", out, "--seed", str(args.seed),
         "--max_steps", str(args.max_steps), "--eval_every", str(args.eval_every),
         "--device_envs", str(args.device_envs)]
  proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
  if proc.returncode != 0:
    raise SystemExit(f"{kind} run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
  with open(out) as f:
    return json.load(f)


def raw_rollouts(num_envs: int, length: int = 128, repeats: int = 20) -> dict:
  """env-steps/s of gymnax CartPole: random actions, and PPO's policy network acting."""
  import jax
  from jrl.agents import ppo
  from jrl.gymnax_envs import GymnaxVecEnv

  env = GymnaxVecEnv("gymnax:CartPole-v1")
  cfg = ppo.Config(**device_agent_args(num_envs))
  networks = ppo.make_networks(env.spec, cfg)
  policy = ppo.make_policy(networks, cfg)
  params = networks.init(jax.random.PRNGKey(0))

  def rollout(with_policy: bool):
    def step(carry, _):
      obs, state, key, actor_state = carry
      key, action_key, step_key = jax.random.split(key, 3)
      if with_policy:
        action, _, actor_state = policy.select_action(params, obs, jax.numpy.zeros(num_envs, bool), actor_state)
      else:
        action = jax.random.randint(action_key, (num_envs,), 0, env.spec.num_actions)
      out = env.step(step_key, state, action)
      return (out.observation, out.state, key, actor_state), out.reward.sum()

    def run(key):
      obs, state = env.reset(key, num_envs)
      carry = (obs, state, key, policy.init(key, num_envs))
      return jax.lax.scan(step, carry, None, length=length)[1].sum()
    return jax.jit(run)

  figures = {}
  for name, with_policy in (("random", False), ("policy", True)):
    fn = rollout(with_policy)
    fn(jax.random.PRNGKey(0)).block_until_ready()
    best = float("inf")
    for r in range(repeats):
      t0 = time.perf_counter()
      fn(jax.random.PRNGKey(r + 1)).block_until_ready()
      best = min(best, time.perf_counter() - t0)
    figures[name] = num_envs * length / best
  return figures


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--max_steps", type=int, default=300_000)
  parser.add_argument("--eval_every", type=int, default=5_000)
  parser.add_argument("--device_envs", type=int, default=128, help="envs of the device run (= its PPO batch_size)")
  parser.add_argument("--_run", choices=("device", "embedded"), help=argparse.SUPPRESS)
  parser.add_argument("--_out", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args._run:
    run_one(args._run, args, args._out)
    return

  cache = tempfile.mkdtemp(prefix="bench-jax-cache-")
  print(f"PPO on CartPole to {THRESHOLD:g}, seed {args.seed}; device run: {args.device_envs} gymnax envs, "
        f"{device_agent_args(args.device_envs)}; embedded run: PPO defaults, 8 gymnasium envs", flush=True)
  raw = raw_rollouts(args.device_envs)
  a = subprocess_run("device", args, cache)
  a2 = subprocess_run("device", args, cache)
  b = subprocess_run("embedded", args, os.path.join(cache, "unused"))

  def row(name, r):
    ttt = "not reached" if r["time_to_threshold"] is None else f"{r['time_to_threshold']:.2f} s"
    return (f"{name:<26} compile {r['compile']:6.2f} s | to threshold excl. compile {ttt:>11} "
            f"({r['steps_to_threshold']} steps) | {r['env_steps_per_second']:>10,.0f} env-steps/s | wall {r['wall']:.2f} s")

  print(row("(a) device", a))
  print(row("(a2) device, cached again", a2))
  print(row("(b) embedded Reverb", b))
  print(f"raw gymnax rollout, {args.device_envs} envs x 128 steps: random actions {raw['random']:,.0f} env-steps/s; "
        f"PPO policy acting {raw['policy']:,.0f} env-steps/s")
  print(f"steady state (acting + learning, no evaluation, no compile): (a) {a['steady_env_steps_per_second']:,.0f} "
        f"env-steps/s, (b) {b['steady_env_steps_per_second']:,.0f} env-steps/s (median of its metric rows)")
  ok = lambda cond: "met" if cond else "MISSED"
  speed = a["env_steps_per_second"] / b["env_steps_per_second"]
  steady = a["steady_env_steps_per_second"] / b["steady_env_steps_per_second"]
  print(f"ratio env-steps/s (a)/(b): end to end {speed:.1f}x (target >= 30x: {ok(speed >= 30)}); "
        f"steady state {steady:.1f}x ({ok(steady >= 30)})")
  if a["time_to_threshold"] and b["time_to_threshold"]:
    frac = a["time_to_threshold"] / b["time_to_threshold"]
    print(f"ratio time to threshold (a)/(b): {frac:.3f} (target <= 0.1: {ok(frac <= 0.1)})")
  loop_frac = a["steady_env_steps_per_second"] / raw["random"]
  print(f"device loop / raw random rollout: {loop_frac:.3f} (target >= 0.3: {ok(loop_frac >= 0.3)}); "
        f"raw policy rollout / raw random: {raw['policy'] / raw['random']:.3f}")
  print(f"compile, second identical run on the persistent cache: {a2['compile']:.2f} s, of which XLA backend "
        f"compile (now cache loads) {a2['backend_compile']:.2f} s; first run {a['compile']:.2f} s, backend "
        f"{a['backend_compile']:.2f} s (tracing and lowering to HLO are not cached)")


if __name__ == "__main__":
  main()
