"""The accelerator check: what jrl's device backend does on the machine it runs on, beside PureJaxRL.

  python -m bench.accelerator_check [--quick] [--out accelerator-check] [--budget_seconds 480]

Arms, each its own process timed from start to exit, each with a JAX compilation cache of its own
that starts empty, in the order of their value (a check cut short still reports what it finished):

  vmapped      `launch.sweep --backend device --seeds 0-15` of PPO on gymnax CartPole, 500k env
               steps each, jrl's default flags: every seed in one compiled program
  purejaxrl    PureJaxRL's PPO (bench/third_party/purejaxrl, as published), `jax.jit(jax.vmap(...))`
               over 16 keys on jrl's PPO defaults (bench/device_sweep.py); it does not evaluate
  wide_jrl     one seed at 2,048 envs (`launch.train --backend device --num_envs 2048 --batch_size
               2048`: one update per rollout of all envs, PureJaxRL's shape): env steps per second
  wide_purejaxrl  PureJaxRL at 2,048 envs, one key
  one_by_one   the same 16 seeds with `--one_by_one` (later seeds load the first's program)

Each arm may take its share of `--budget_seconds` (at most what is left of it) and is stopped past
it, recorded as such; `--only vmapped,one_by_one` runs some arms (on a CPU, with a budget of an
hour, the 16-seed arms give the host-share figures). After every arm the folder `--out` gets
`results.json` (every figure, and each vmapped seed's report phases) and `table.md` (the rows for
the docs' performance page): wall seconds, the ratios the device-loop issue asks for (vmapped
against PureJaxRL's process and against one by one), the host's share of the vmapped runs (their
reports' eval + other) against a single run's, env steps per second at 2,048 envs, and the
accelerator JAX saw. The GPU-machine issue's arms (embedded DQN with the learner on the GPU, a
distributed DQN with its inference server) are not built yet: the table says so.

`--quick` runs the same arms small (2 seeds, a few thousand steps, 64 envs for the wide arms) on
any machine, CPU included, in a minute or two: tests/test_accelerator_check.py keeps it working.

On a GPU machine that reaches no package registry (Python 3.12 with JAX for CUDA, flax, optax,
chex, numpy, matplotlib and tensorboard installed, nothing else): copy in a checkout with the
wheels its image lacks, downloaded beforehand where a registry is reached, for Python 3.12 at the
versions of requirements-core-py312.txt (`pip download --no-deps --only-binary=:all:
--python-version 3.12` of gymnax==1.0.1, gymnasium, farama-notifications, rlax, distrax, dm-tree,
dm-env, tfp-nightly, decorator, gast, portpicker, arch, pandas, pytz, tzdata; rliable built with
`pip wheel --no-deps`), then from the checkout's root:

  python3 -m pip install --no-index --no-deps --target /tmp/site WHEEL_FOLDER/*.whl
  PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 timeout 540 python3 -m bench.accelerator_check --out $OUT/check

and copy `--out` back (it is rewritten after each arm, so a run cut short leaves what it finished).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from bench import device_sweep  # noqa: E402  (the sweep arms and PureJaxRL's config, shared)

AGENT, ENV = "ppo", "gymnax:CartPole-v1"


class Sizes:
  """How big the arms are: the issue's (full) or a quick run's."""

  def __init__(self, quick: bool):
    self.seeds = 2 if quick else 16
    self.steps = 8_192 if quick else 500_000
    self.wide_envs = 64 if quick else 2_048
    self.wide_steps = 65_536 if quick else 20_971_520  # 160 rollouts of 64 steps at 2,048 envs
    # Each arm's cap, a share of the whole budget (and never more than what is left of it), so that
    # one slow arm cannot take the time of the arms after it.
    self.cap_shares = {"vmapped": 0.4, "purejaxrl": 0.2, "wide_jrl": 0.2, "wide_purejaxrl": 0.15, "one_by_one": 0.6}


def timed(command: List[str], timeout: float, env: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
  """Runs `command` from the repository root with an empty compilation cache of its own: its wall
  seconds start to exit, its exit status, the end of its output; `timed_out` past `timeout`."""
  cache = tempfile.mkdtemp(prefix="jax-cache-")
  start = time.monotonic()
  try:
    done = subprocess.run(command, cwd=ROOT, env={**os.environ, "JRL_JAX_CACHE": cache, **(env or {})},
                          capture_output=True, text=True, timeout=max(timeout, 1.0))
  except subprocess.TimeoutExpired:
    return {"wall_seconds": round(time.monotonic() - start, 1), "ok": False, "timed_out": True}
  record = {"wall_seconds": round(time.monotonic() - start, 1), "ok": done.returncode == 0, "timed_out": False}
  if done.returncode != 0:
    record["error"] = (done.stdout[-1500:] + done.stderr[-1500:]).strip()
  record["stdout"] = done.stdout
  return record


def host_share(seeds: List[Dict[str, Any]]) -> float:
  """The mean host seconds (eval + other in the reports) of a sweep's runs."""
  return sum(s["phase_seconds"]["eval"] + s["phase_seconds"]["other"] for s in seeds) / len(seeds)


def sweep_arm(name: str, sizes: Sizes, folder: str, timeout: float, extra=()) -> Dict[str, Any]:
  run_dir = os.path.join(folder, name)
  record = timed(device_sweep.sweep_command(AGENT, ENV, sizes.seeds, sizes.steps, run_dir, extra), timeout)
  record.pop("stdout", None)
  if record["ok"]:
    record["seeds"] = device_sweep.seed_results(run_dir, sizes.seeds)
    record["reached_475"] = sum((s["best"] or 0) >= 475 for s in record["seeds"])
    record["host_seconds_per_run"] = round(host_share(record["seeds"]), 2)
  return record


def purejaxrl_arm(sizes: Sizes, seeds: int, num_envs: int, steps: int, timeout: float) -> Dict[str, Any]:
  spec = {"seeds": seeds, "config": device_sweep.purejaxrl_config(steps, ENV, num_envs)}
  record = timed([sys.executable, device_sweep.__file__, "--child_purejaxrl", json.dumps(spec)], timeout)
  out = record.pop("stdout", "")
  if record["ok"]:
    record["training_return_finals"] = json.loads(out.strip().splitlines()[-1])["finals"]
  record["config"] = spec["config"]
  return record


def wide_jrl_arm(sizes: Sizes, folder: str, timeout: float) -> Dict[str, Any]:
  run_dir = os.path.join(folder, "wide")
  n = str(sizes.wide_envs)
  record = timed([sys.executable, "-m", "launch.train", "--agent", AGENT, "--env", ENV, "--backend", "device",
                  "--num_envs", n, "--batch_size", n, "--steps", str(sizes.wide_steps), "--progress_seconds", "30",
                  "--run_dir", run_dir], timeout)
  record.pop("stdout", None)
  if record["ok"]:
    with open(os.path.join(run_dir, "summary.json")) as f:
      summary = json.load(f)
    record["env_steps"] = summary["actor_steps"]
    record["loop_env_steps_per_second"] = round(summary["rates"]["env_steps_per_second"])
    record["process_env_steps_per_second"] = round(summary["actor_steps"] / record["wall_seconds"])
    record["phase_seconds"] = summary["phase_seconds"]["main"]
  return record


def devices() -> Dict[str, Any]:
  done = subprocess.run([sys.executable, "-c", "import json, jax; d = jax.devices(); print(json.dumps("
                         "{'platform': d[0].platform, 'kind': d[0].device_kind, 'count': len(d), "
                         "'jax': jax.__version__}))"], cwd=ROOT, capture_output=True, text=True, timeout=120)
  return json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {"error": done.stderr[-500:]}


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
  return round(a / b, 3) if a and b else None


def summarise(record: Dict[str, Any]) -> Dict[str, Any]:
  """The figures the device-loop issue asks for, from the arms that finished."""
  arms = record["arms"]
  wall = lambda name: arms[name]["wall_seconds"] if arms.get(name, {}).get("ok") else None
  figures = {"vmapped_over_purejaxrl": ratio(wall("vmapped"), wall("purejaxrl")),
             "vmapped_over_one_by_one": ratio(wall("vmapped"), wall("one_by_one"))}
  if wall("vmapped") and wall("one_by_one"):
    # The host's seconds (eval + other) of a vmapped run, which lives the whole sweep's host work,
    # against a run of its own (one by one's, each its own process).
    figures["host_vmapped_over_single"] = ratio(arms["vmapped"]["host_seconds_per_run"],
                                                arms["one_by_one"]["host_seconds_per_run"])
  if wall("wide_jrl") and wall("wide_purejaxrl"):
    pure = record["sizes"]["wide_steps"] / wall("wide_purejaxrl")
    figures["wide_purejaxrl_process_env_steps_per_second"] = round(pure)
    figures["wide_jrl_over_purejaxrl_process_rate"] = ratio(arms["wide_jrl"]["process_env_steps_per_second"], pure)
  return figures


def table(record: Dict[str, Any]) -> str:
  """The rows for the docs' performance page."""
  dev = record["devices"]
  lines = [f"Accelerator check ({'quick' if record['quick'] else 'full'}), {record['date']}: "
           f"{dev.get('count', '?')} x {dev.get('kind', '?')} ({dev.get('platform', '?')}), JAX {dev.get('jax', '?')}; "
           f"{record['sizes']['seeds']} seeds of {AGENT} on {ENV}, {record['sizes']['steps']} env steps each.", "",
           "| arm | wall (s) | notes |", "|---|---:|---|"]
  for name, arm in record["arms"].items():
    if arm.get("timed_out"):
      note = "stopped at its time limit"
    elif not arm.get("ok"):
      note = "failed: " + arm.get("error", "")[-200:].replace("\n", " ").replace("|", "/")
    elif "seeds" in arm:
      note = f"{arm['reached_475']}/{len(arm['seeds'])} seeds reached 475; host {arm['host_seconds_per_run']} s a run"
    elif "loop_env_steps_per_second" in arm:
      note = (f"{arm['env_steps']} env steps: {arm['loop_env_steps_per_second']:,} env steps/s in the loop, "
              f"{arm['process_env_steps_per_second']:,} over the process")
    else:
      note = "training returns (no evaluation)"
    lines.append(f"| {name} | {arm['wall_seconds']} | {note} |")
  lines += ["", "| figure | value |", "|---|---:|"]
  lines += [f"| {k} | {v} |" for k, v in record["figures"].items()]
  lines += ["", "The GPU-machine issue's arms (embedded DQN with the learner on the GPU; distributed DQN with "
                "its inference server) are not built yet."]
  return "\n".join(lines) + "\n"


def write(record: Dict[str, Any], out: str) -> None:
  record["figures"] = summarise(record)
  with open(os.path.join(out, "results.json"), "w") as f:
    json.dump(record, f, indent=1)
  with open(os.path.join(out, "table.md"), "w") as f:
    f.write(table(record))


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--quick", action="store_true", help="the same arms, small (any machine, a minute or two)")
  parser.add_argument("--out", default="accelerator-check", help="folder for results.json and table.md")
  parser.add_argument("--budget_seconds", type=float, default=480.0, help="all arms together (default 8 minutes)")
  parser.add_argument("--only", default="", help="comma-separated arms to run (default: all)")
  args = parser.parse_args(argv)
  sizes = Sizes(args.quick)
  os.makedirs(args.out, exist_ok=True)
  folder = tempfile.mkdtemp(prefix="accelerator-check-")
  deadline = time.monotonic() + args.budget_seconds
  record = {"date": time.strftime("%Y-%m-%d"), "quick": args.quick, "devices": devices(),
            "sizes": {"seeds": sizes.seeds, "steps": sizes.steps, "wide_envs": sizes.wide_envs,
                      "wide_steps": sizes.wide_steps}, "arms": {}}
  print(f"accelerator check: {record['devices']}; runs in {folder}", flush=True)
  arms = [("vmapped", lambda t: sweep_arm("vmapped", sizes, folder, t)),
          ("purejaxrl", lambda t: purejaxrl_arm(sizes, sizes.seeds, 0, sizes.steps, t)),
          ("wide_jrl", lambda t: wide_jrl_arm(sizes, folder, t)),
          ("wide_purejaxrl", lambda t: purejaxrl_arm(sizes, 1, sizes.wide_envs, sizes.wide_steps, t)),
          ("one_by_one", lambda t: sweep_arm("one_by_one", sizes, folder, t, ["--one_by_one"]))]
  only = [name for name in args.only.split(",") if name]
  unknown = sorted(set(only) - {name for name, _ in arms})
  if unknown:
    parser.error(f"--only: no arm named {', '.join(unknown)}")
  for name, arm in arms:
    if only and name not in only:
      continue
    left = deadline - time.monotonic()
    if left < 5:
      record["arms"][name] = {"wall_seconds": 0.0, "ok": False, "timed_out": True}
      continue
    record["arms"][name] = arm(min(left, sizes.cap_shares[name] * args.budget_seconds))
    write(record, args.out)
    print(f"{name:15s} {record['arms'][name]['wall_seconds']:8.1f} s "
          f"{'ok' if record['arms'][name]['ok'] else 'NOT OK'}", flush=True)
  write(record, args.out)
  print(table(record), flush=True)
  return 0 if all(a["ok"] for a in record["arms"].values()) else 1


if __name__ == "__main__":
  sys.exit(main())
