"""N seeds of one device run: as one vmapped program against N runs one after another.

  .venv/bin/python bench/device_sweep.py [--seeds 16] [--steps 500000] [--agent ppo] [--env gymnax:CartPole-v1]
                                         [--out device_sweep.json] [--no_purejaxrl]

Both arms are the user's command (`python -m launch.sweep --backend device`, and the same with
`--one_by_one`), each timed from start to exit with a JAX compilation cache of its own that
starts empty: the vmapped arm compiles its one program, the other compiles once and its later
seeds load the cached program (as a user's second run would). Prints each arm's wall time, their
ratio and every seed's best and final evaluation, and writes them to --out.

For PPO on a gymnax env a third arm runs PureJaxRL's PPO (bench/third_party/purejaxrl, its file
as published) the way its README sweeps seeds, `jax.jit(jax.vmap(make_train(config)))` over N
keys, on jrl's PPO defaults (envs, rollout length, epochs, minibatches, learning rate without
annealing, discount, GAE, clipping, entropy, value and gradient-norm coefficients, ReLU; its
separate 64x64 policy and value MLPs are jrl's default shape, with its own orthogonal
initialisation). Timed the same way, start to exit of its process. It does not evaluate:
its per-seed figure is the training return (the mean of the episodes that ended in its last 10
rollouts), where jrl's arms report greedy evaluations (and spend time on them). `--no_purejaxrl`
leaves it out.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sweep_command(agent: str, env: str, seeds: int, steps: int, run_dir: str, extra=()):
  """The user's seed-sweep command on the device backend."""
  return [sys.executable, "-m", "launch.sweep", "--agent", agent, "--env", env, "--backend", "device",
          "--seeds", f"0-{seeds - 1}", "--steps", str(steps), "--run_dir", run_dir, "--progress_seconds", "30", *extra]


def seed_results(run_dir: str, seeds: int):
  """Each seed's summary of a sweep folder: its evaluations, its digest and its phase seconds."""
  results = []
  for seed in range(seeds):
    name_dir = next(d for d in os.listdir(run_dir) if d.endswith(f"-s{seed}"))
    with open(os.path.join(run_dir, name_dir, "summary.json")) as f:
      summary = json.load(f)
    results.append({"seed": seed, "final": summary["eval_return"], "best": summary["best_eval_return"],
                    "steps_to_threshold": summary["steps_to_threshold"], "digest": summary["params_digest"][:16],
                    "wall_seconds": summary["wall_seconds"], "phase_seconds": summary["phase_seconds"]["main"]})
  return results


def run_arm(name: str, args, extra, folder: str):
  cache = tempfile.mkdtemp(prefix=f"jax-cache-{name}-")
  run_dir = os.path.join(folder, name)
  command = sweep_command(args.agent, args.env, args.seeds, args.steps, run_dir, extra)
  start = time.monotonic()
  done = subprocess.run(command, cwd=ROOT, env=dict(os.environ, JRL_JAX_CACHE=cache), capture_output=True, text=True)
  wall = time.monotonic() - start
  if done.returncode != 0:
    sys.exit(f"{name} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
  seeds = seed_results(run_dir, args.seeds)
  print(f"{name:10s} {wall:8.1f} s | reached the threshold: "
        f"{sum(s['steps_to_threshold'] is not None for s in seeds)}/{args.seeds} | finals "
        + " ".join(f"{s['final']:.0f}" for s in seeds), flush=True)
  return {"wall_seconds": round(wall, 1), "seeds": seeds}


PUREJAXRL = os.path.join(ROOT, "bench", "third_party", "purejaxrl")


def purejaxrl_config(steps: int, env: str, num_envs: int = 0) -> dict:
  """PureJaxRL's config keys, set to what jrl's PPO runs by default (its Config and --num_envs, or
  `num_envs` envs, where jrl's batch is all of them: one update per rollout, as PureJaxRL's)."""
  sys.path.insert(0, ROOT)
  from jrl.agents.ppo import Config
  from jrl.experiment.config import ExperimentConfig
  cfg, num_envs = Config(), num_envs or ExperimentConfig().num_envs
  if set(cfg.hidden_sizes) != {64} or len(cfg.hidden_sizes) != 2:
    sys.exit(f"device_sweep: PureJaxRL's network is 64x64; jrl's PPO default is {cfg.hidden_sizes}")
  return {"LR": cfg.learning_rate, "NUM_ENVS": num_envs, "NUM_STEPS": cfg.sequence_length,
          "TOTAL_TIMESTEPS": steps, "UPDATE_EPOCHS": cfg.num_epochs, "NUM_MINIBATCHES": cfg.num_minibatches,
          "GAMMA": cfg.discount, "GAE_LAMBDA": cfg.gae_lambda, "CLIP_EPS": cfg.clip_epsilon,
          "ENT_COEF": cfg.entropy_cost, "VF_COEF": cfg.value_cost, "MAX_GRAD_NORM": cfg.max_grad_norm,
          "ACTIVATION": "relu", "ENV_NAME": env.partition(":")[2], "ANNEAL_LR": False, "DEBUG": False}


def purejaxrl_child(spec: dict) -> None:
  """In this process: PureJaxRL's vmapped training of spec["seeds"] keys; prints one JSON line."""
  import numpy as np
  sys.path.insert(0, PUREJAXRL)
  import distrax  # noqa: F401 (PureJaxRL's own imports; no TensorFlow in this process)
  import jax
  import ppo  # PureJaxRL's ppo.py
  train = jax.jit(jax.vmap(ppo.make_train(spec["config"])))
  out = jax.block_until_ready(train(jax.random.split(jax.random.PRNGKey(0), spec["seeds"])))
  # [seeds, rollouts, steps, envs]: the returns of the episodes that ended in the last 10 rollouts
  returns = np.asarray(out["metrics"]["returned_episode_returns"])[:, -10:]
  ended = np.asarray(out["metrics"]["returned_episode"])[:, -10:]
  finals = [float(returns[s][ended[s]].mean()) if ended[s].any() else float("nan") for s in range(spec["seeds"])]
  print(json.dumps({"finals": finals}), flush=True)


def run_purejaxrl(args) -> dict:
  """The PureJaxRL arm: its own process, timed from start to exit like jrl's arms."""
  spec = {"seeds": args.seeds, "config": purejaxrl_config(args.steps, args.env)}
  start = time.monotonic()
  done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child_purejaxrl", json.dumps(spec)],
                        cwd=ROOT, capture_output=True, text=True)
  wall = time.monotonic() - start
  if done.returncode != 0:
    sys.exit(f"purejaxrl failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
  finals = json.loads(done.stdout.strip().splitlines()[-1])["finals"]
  print(f"{'purejaxrl':10s} {wall:8.1f} s | training returns at the end (not greedy evaluations): "
        + " ".join(f"{f:.0f}" for f in finals), flush=True)
  return {"wall_seconds": round(wall, 1), "config": spec["config"], "training_return_finals": finals}


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--seeds", type=int, default=16)
  parser.add_argument("--steps", type=int, default=500_000)
  parser.add_argument("--agent", default="ppo")
  parser.add_argument("--env", default="gymnax:CartPole-v1")
  parser.add_argument("--out", default="device_sweep.json")
  parser.add_argument("--no_purejaxrl", action="store_true", help="leave out the PureJaxRL arm")
  parser.add_argument("--child_purejaxrl", default=None, help=argparse.SUPPRESS)  # the arm's own process
  args = parser.parse_args()
  if args.child_purejaxrl is not None:
    return purejaxrl_child(json.loads(args.child_purejaxrl))
  folder = tempfile.mkdtemp(prefix="device-sweep-")
  print(f"{args.seeds} seeds of {args.agent} on {args.env}, {args.steps} env steps each, in {folder}", flush=True)
  vmapped = run_arm("vmapped", args, [], folder)
  one_by_one = run_arm("one_by_one", args, ["--one_by_one"], folder)
  ratio = vmapped["wall_seconds"] / one_by_one["wall_seconds"]
  print(f"vmapped / one by one: {ratio:.3f} of the wall time", flush=True)
  record = {"agent": args.agent, "env": args.env, "seeds": args.seeds, "steps": args.steps,
            "vmapped": vmapped, "one_by_one": one_by_one, "wall_ratio": round(ratio, 3)}
  if args.agent == "ppo" and args.env.startswith("gymnax:") and not args.no_purejaxrl:
    purejaxrl = run_purejaxrl(args)
    record["purejaxrl"] = purejaxrl
    record["wall_ratio_vmapped_to_purejaxrl"] = round(vmapped["wall_seconds"] / purejaxrl["wall_seconds"], 3)
    print(f"jrl vmapped / PureJaxRL vmapped: {record['wall_ratio_vmapped_to_purejaxrl']:.3f} of the wall time",
          flush=True)
  with open(args.out, "w") as f:
    json.dump(record, f, indent=1)


if __name__ == "__main__":
  main()
