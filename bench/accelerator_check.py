"""The accelerator check: what jrl does on the machine it runs on: its device backend beside
PureJaxRL, and embedded and distributed DQN with the learner on the accelerator.

  python -m bench.accelerator_check [--quick] [--out accelerator-check] [--budget_seconds 480 (quick: 2400)] [--only ARMS]

Arms, each its own process timed from start to exit, each with a JAX compilation cache of its own
that starts empty, in the order of their value (a check cut short still reports what it finished).
The device loop's (`--only device`):

  vmapped      `launch.sweep --backend device --seeds 0-15` of PPO on gymnax CartPole, 500k env
               steps each, jrl's default flags: every seed in one compiled program
  purejaxrl    PureJaxRL's PPO (bench/third_party/purejaxrl, as published), `jax.jit(jax.vmap(...))`
               over 16 keys on jrl's PPO defaults (bench/device_sweep.py); it does not evaluate
  wide_jrl     one seed at 2,048 envs (`launch.train --backend device --num_envs 2048 --batch_size
               2048`: one update per rollout of all envs, PureJaxRL's shape): env steps per second
  wide_purejaxrl  PureJaxRL at 2,048 envs, one key
  one_by_one   the same 16 seeds with `--one_by_one` (later seeds load the first's program)

Embedded DQN (`--only embedded`; they run on the Python 3.12 core too: `--deterministic`, the
seeded in-process replay, no Reverb), one `launch.train` run each, named
dqn_{minatar,atari}_b{32,256}_{cpu,acc_actor_cpu,acc_actor_acc}:

  minatar      MinAtar/Breakout-v1 with `--preset minatar` (its small CNN, 8 envs)
  atari        ALE/Pong-v5 (the atari preset's frames, the Nature CNN, 8 envs); skipped, with the
               reason, where ale-py or its ROMs are missing
  b32, b256    the learner's batch, `samples_per_insert` scaled with it so that the learner makes the
               preset's one update per 4 env steps at both (quick Atari: one update in all)
  cpu          everything on the CPU (`JAX_PLATFORMS=cpu`): the figure the others are set beside
  acc_actor_cpu  the learner on the accelerator, the actor's policy on the CPU (`--actor_device cpu`)
  acc_actor_acc  the learner and the policy on the accelerator (`--actor_device accelerator`)

An arm records env steps/s and learner updates/s from its run's summary.json (`rates`: the whole
session, compilation and the final evaluation included), the steady rates between its first and
last learner metric rows (compiled, learning; also what an arm stopped at its time limit leaves),
and where each part ran (the summary's details["devices"]). Without an accelerator the acc_ arms
are recorded as skipped ("no accelerator"), not failed, and the cpu arms run.

  distributed_dqn  `launch.train --distributed --agent dqn --env MinAtar/Breakout-v1 --num_actors 8
               --inference server` (the minatar preset's learning flags): env steps/s, the inference
               server's batch mean and updates/s from its summary, and its devices; only where an
               accelerator and launchpad (Python 3.10, jrl[distributed]) meet, skipped otherwise
               (`--only distributed`)

Each arm may take its share of `--budget_seconds` (at most what is left of it) and is stopped past
it, recorded as such; `--only vmapped,one_by_one` runs some arms, `--only embedded` a group (device,
embedded, distributed); all arms do not fit one 8-minute budget: run the groups as checks of their
own. On a CPU, with a budget of an hour, the 16-seed arms give the host-share figures. After every
arm the folder `--out` gets `results.json` (every figure, and each vmapped seed's report phases) and
`table.md` (the rows for the docs' performance page): wall seconds, the ratios the device-loop
issue asks for (vmapped against PureJaxRL's process and against one by one), the host's share of
the vmapped runs (their reports' eval + other) against a single run's, each 16-seed arm's compile
and loop seconds (the vmapped sweep's shared ones; one by one, their sum), env steps per second at
2,048 envs, the embedded arms' rates beside the CPU's, the distributed arm's, and the accelerator
JAX saw.

`--quick` runs the same arms small (2 seeds, a few thousand steps, 64 envs for the wide arms, a few
thousand env steps of embedded DQN) on any machine, CPU included, in a minute or two a group (the
Atari arms at batch 256 take minutes on a 2-core CPU): tests/test_accelerator_check.py keeps it
working.

On a GPU machine that reaches no package registry (Python 3.12 with JAX for CUDA, flax, optax,
chex, numpy, matplotlib and tensorboard installed, nothing else): copy in a checkout with the
wheels its image lacks, downloaded beforehand where a registry is reached, for Python 3.12 at the
versions of requirements-core-py312.txt (`pip download --no-deps --only-binary=:all:
--python-version 3.12` of gymnax==1.0.1, gymnasium, farama-notifications, rlax, distrax, dm-tree,
dm-env, tfp-nightly, decorator, gast, portpicker, arch, pandas, pytz, tzdata, and for the embedded
arms MinAtar, ale-py, opencv-python-headless and PyYAML; rliable built with `pip wheel --no-deps`),
then from the checkout's root:

  python3 -m pip install --no-index --no-deps --target /tmp/site WHEEL_FOLDER/*.whl
  export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
  timeout 540 python3 -m bench.accelerator_check --only device --out $OUT/check
  timeout 540 python3 -m bench.accelerator_check --only embedded --out $OUT/embedded

and copy `--out` back (it is rewritten after each arm, so a run cut short leaves what it finished).
"""

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from bench import device_sweep  # noqa: E402  (the sweep arms and PureJaxRL's config, shared)

AGENT, ENV = "ppo", "gymnax:CartPole-v1"
DEVICE_ARMS = ("vmapped", "purejaxrl", "wide_jrl", "wide_purejaxrl", "one_by_one")
# The embedded DQN arms: game -> env id, the learner's batch sizes, and placement -> (JAX may use the
# accelerator, --actor_device).
GAMES = {"minatar": "MinAtar/Breakout-v1", "atari": "ALE/Pong-v5"}
BATCHES = (32, 256)
PLACEMENTS = {"cpu": (False, "cpu"), "acc_actor_cpu": (True, "cpu"), "acc_actor_acc": (True, "accelerator")}
DISTRIBUTED_ENV, DISTRIBUTED_ACTORS = "MinAtar/Breakout-v1", 8
NO_ACCELERATOR = "no accelerator"


def embedded_name(game: str, batch: int, placement: str) -> str:
  return f"dqn_{game}_b{batch}_{placement}"


EMBEDDED_ARMS = tuple(embedded_name(g, b, p) for g in GAMES for b in BATCHES for p in PLACEMENTS)
GROUPS = {"device": DEVICE_ARMS, "embedded": EMBEDDED_ARMS, "distributed": ("distributed_dqn",)}


class Sizes:
  """How big the arms are: the issue's (full) or a quick run's."""

  def __init__(self, quick: bool):
    self.seeds = 2 if quick else 16
    self.steps = 8_192 if quick else 500_000
    self.wide_envs = 64 if quick else 2_048
    self.wide_steps = 65_536 if quick else 20_971_520  # 160 rollouts of 64 steps at 2,048 envs
    # Each arm's cap, a share of the whole budget (and never more than what is left of it), so that
    # one slow arm cannot take the time of the arms after it.
    self.cap_shares = {"vmapped": 0.4, "purejaxrl": 0.2, "wide_jrl": 0.2, "wide_purejaxrl": 0.15, "one_by_one": 0.6,
                       "distributed_dqn": 0.35}
    # Embedded DQN: twelve arms of about 30 s each on an accelerator host fill `--only embedded`'s
    # budget; an arm slower than its share (the CPU's Atari at batch 256) leaves its steady rates.
    self.cap_shares.update({name: 0.08 for name in EMBEDDED_ARMS})
    self.embedded_steps = {"minatar": 3_000 if quick else 30_000, "atari": 512 if quick else 20_000}
    self.embedded_min_replay = {"minatar": 1_000 if quick else 5_000, "atari": 256 if quick else 5_000}
    # Learner updates per env step (samples_per_insert / batch): the minatar preset's 8 at batch 32 at
    # both batches, and its 8 updates a learner call; a quick Atari run makes one update (on a 2-core CPU
    # the Nature CNN's update takes 0.7 s at batch 32 and 18 s at 256).
    self.updates_per_env_step = {"minatar": 1 / 4, "atari": 1 / 256 if quick else 1 / 4}
    self.atari_updates_per_call = 1 if quick else 8
    self.embedded_log_every = {"minatar": 1_000, "atari": 128 if quick else 1_000}
    self.distributed_steps = 5_000 if quick else 100_000


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
    record.update(process_phases(record["seeds"], vmapped="--one_by_one" not in extra))
  return record


def process_phases(seeds: List[Dict[str, Any]], vmapped: bool) -> Dict[str, float]:
  """The process's compile and loop seconds from its runs' reports: a vmapped sweep's runs each
  report the sweep's one compile and loop (shared); runs one by one each report their own."""
  phase = lambda key: seeds[0]["phase_seconds"][key] if vmapped else sum(s["phase_seconds"][key] for s in seeds)
  return {"compile_seconds": round(phase("compile"), 1), "loop_seconds": round(phase("device_loop"), 1)}


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


def embedded_command(game: str, batch: int, actor_device: str, sizes: Sizes, run_dir: str) -> List[str]:
  """The user's embedded DQN command of an arm: seeded in-process replay, one final evaluation of one
  episode, `samples_per_insert` for the sizes' learner updates per env step at this batch."""
  steps = sizes.embedded_steps[game]
  command = [sys.executable, "-m", "launch.train", "--agent", "dqn", "--env", GAMES[game], "--deterministic",
             "--batch_size", str(batch), "--samples_per_insert", f"{batch * sizes.updates_per_env_step[game]:g}",
             "--min_replay_size", str(sizes.embedded_min_replay[game]), "--steps", str(steps),
             "--eval_every", str(steps), "--eval_episodes", "1", "--log_every", str(sizes.embedded_log_every[game]),
             "--progress_seconds", "30", "--actor_device", actor_device, "--run_dir", run_dir]
  if game == "minatar":
    return command + ["--preset", "minatar"]
  # The minatar preset's shape for Atari (jrl has no Atari preset): 8 envs, 8 updates a learner call.
  return command + ["--num_envs", "8", "--updates_per_call", str(sizes.atari_updates_per_call),
                    "--max_replay_size", "50000", "--target_update_period", "1000"]


def steady_rates(run_dir: str) -> Dict[str, float]:
  """Env steps and learner updates per second between the run's first and last learner metric rows
  (learning, compiled: replay's fill, the first compilation and the final evaluation left out);
  empty with fewer than two rows."""
  try:
    with open(os.path.join(run_dir, "metrics", "learner.csv"), newline="") as f:
      rows = [r for r in csv.DictReader(f) if float(r["learner_steps"]) > 0]
  except (OSError, KeyError, ValueError):
    return {}
  if len(rows) < 2:
    return {}
  first, last = rows[0], rows[-1]
  seconds = float(last["wall_seconds"]) - float(first["wall_seconds"])
  if seconds <= 0 or float(last["learner_steps"]) <= float(first["learner_steps"]):
    return {}  # no learning between the rows
  return {"steady_env_steps_per_second": round((float(last["actor_steps"]) - float(first["actor_steps"])) / seconds, 1),
          "steady_updates_per_second": round((float(last["learner_steps"]) - float(first["learner_steps"])) / seconds,
                                             1)}


def run_figures(run_dir: str, record: Dict[str, Any], rates: Tuple[str, ...]) -> Dict[str, Any]:
  """`record` with what a run's summary.json says: its env steps, `rates` from its summary's rates,
  its bottleneck and where each part ran."""
  with open(os.path.join(run_dir, "summary.json")) as f:
    summary = json.load(f)
  record["env_steps"] = summary["actor_steps"]
  for key in rates:
    value = summary["rates"].get(key)
    record[key] = round(value, 4) if isinstance(value, float) else value
  record["bottleneck"] = summary.get("bottleneck")
  record["devices"] = summary["details"].get("devices")
  return record


def embedded_arm(game: str, batch: int, placement: str, sizes: Sizes, folder: str, timeout: float,
                 skip: Optional[str]) -> Dict[str, Any]:
  """One embedded DQN run (`embedded_command`): its rates and devices, or why it was skipped."""
  on_accelerator, actor_device = PLACEMENTS[placement]
  config = {"env": GAMES[game], "batch_size": batch, "actor_device": actor_device,
            "jax": "the default (the accelerator)" if on_accelerator else "JAX_PLATFORMS=cpu"}
  if skip:
    return {"wall_seconds": 0.0, "ok": None, "skipped": skip, "config": config}
  run_dir = os.path.join(folder, embedded_name(game, batch, placement))
  command = embedded_command(game, batch, actor_device, sizes, run_dir)
  record = timed(command, timeout, None if on_accelerator else {"JAX_PLATFORMS": "cpu"})
  record.pop("stdout", None)
  record["config"] = config
  record.update(steady_rates(run_dir))  # what a run stopped at its time limit leaves too
  if record["ok"]:
    run_figures(run_dir, record, ("env_steps_per_second", "updates_per_second"))
  return record


def distributed_arm(sizes: Sizes, folder: str, timeout: float, skip: Optional[str]) -> Dict[str, Any]:
  """The distributed DQN program with its inference server, where an accelerator and launchpad meet."""
  config = {"env": DISTRIBUTED_ENV, "num_actors": DISTRIBUTED_ACTORS, "inference": "server", "batch_size": 32}
  if skip:
    return {"wall_seconds": 0.0, "ok": None, "skipped": skip, "config": config}
  run_dir = os.path.join(folder, "distributed_dqn")
  # The minatar preset's learning flags, without its --deterministic (a program's replay is Reverb).
  command = [sys.executable, "-m", "launch.train", "--distributed", "--agent", "dqn", "--env", DISTRIBUTED_ENV,
             "--num_actors", str(DISTRIBUTED_ACTORS), "--inference", "server", "--num_envs", "8",
             "--batch_size", "32", "--samples_per_insert", "8", "--updates_per_call", "8", "--learning_rate", "3e-4",
             "--min_replay_size", str(min(5_000, sizes.distributed_steps // 2)), "--max_replay_size", "100000",
             "--target_update_period", "1000", "--steps", str(sizes.distributed_steps),
             "--eval_every", str(sizes.distributed_steps), "--eval_episodes", "1", "--progress_seconds", "30",
             "--run_dir", run_dir]
  record = timed(command, timeout)
  record.pop("stdout", None)
  record["config"] = config
  if record["ok"]:
    run_figures(run_dir, record, ("env_steps_per_second", "run_env_steps_per_second", "updates_per_second",
                                  "inference_batch_mean"))
  return record


def atari_missing() -> Optional[str]:
  """Why the Atari arms cannot run here (ale-py or its ROMs missing), or None."""
  probe = f"from jrl import envs; envs.make_vector_env({GAMES['atari']!r}, 1, seed=0).close()"
  done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300)
  if done.returncode == 0:
    return None
  last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
  return f"no Atari: {GAMES['atari']} cannot be made here (ale-py or its ROMs missing): {last[-300:]}"


def launchpad_missing() -> Optional[str]:
  """Why a distributed program cannot run here (launchpad does not import), or None."""
  done = subprocess.run([sys.executable, "-c", "import launchpad, reverb"], cwd=ROOT, capture_output=True, text=True,
                        timeout=300)
  if done.returncode == 0:
    return None
  return ("no distributed stack: launchpad and reverb do not import (Python 3.10 with jrl[distributed]): "
          + (done.stderr.strip().splitlines() or ["(no output)"])[-1][-200:])


def devices() -> Dict[str, Any]:
  done = subprocess.run([sys.executable, "-c", "import json, jax; d = jax.devices(); print(json.dumps("
                         "{'platform': d[0].platform, 'kind': d[0].device_kind, 'count': len(d), "
                         "'jax': jax.__version__}))"], cwd=ROOT, capture_output=True, text=True, timeout=120)
  return json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {"error": done.stderr[-500:]}


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
  return round(a / b, 3) if a and b else None


def summarise(record: Dict[str, Any]) -> Dict[str, Any]:
  """The figures the device-loop issue asks for, from the arms that finished, and each embedded
  accelerator arm's rates over the same run on the CPU."""
  arms = record["arms"]
  wall = lambda name: arms[name]["wall_seconds"] if arms.get(name, {}).get("ok") else None
  figures = {}
  if any(name in arms for name in DEVICE_ARMS):
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
  for game in GAMES:
    for batch in BATCHES:
      cpu = arms.get(embedded_name(game, batch, "cpu"), {})
      for placement in ("acc_actor_cpu", "acc_actor_acc"):
        arm = arms.get(embedded_name(game, batch, placement), {})
        for key, short in (("steady_env_steps_per_second", "env_steps"), ("steady_updates_per_second", "updates")):
          if arm.get(key) and cpu.get(key):  # steady rates: those an arm stopped at its limit has too
            figures[f"{embedded_name(game, batch, placement)}_over_cpu_{short}"] = ratio(arm[key], cpu[key])
  return figures


def _rate(value: Any) -> str:
  if value is None:
    return "-"
  return f"{value:,.0f}" if value >= 100 else f"{value:.1f}" if value >= 1 else f"{value:.2g}"


def _devices(arm: Dict[str, Any], role: str) -> str:
  return ", ".join((arm.get("devices") or {}).get(role, [])) or "-"


def not_built(record: Dict[str, Any]) -> str:
  """What the GPU-machine issue asks for that this check did not measure."""
  lines = ["Not measured by this check: a learner over several GPUs (`--learner_devices` > 1), several inference "
           "servers, a program over several hosts, and `--actor_device auto` (its pick is one of the two "
           "placements above, by the policy's FLOPs)."]
  distributed = record["arms"].get("distributed_dqn")
  if distributed is None:
    lines.append("The distributed DQN arm (8 actors, the inference server) was not asked for (`--only`).")
  elif distributed.get("skipped"):
    lines.append(f"The distributed DQN arm (8 actors, the inference server) was skipped: {distributed['skipped']}; "
                 "it runs where Python 3.10 with jrl[distributed] and a GPU meet.")
  return " ".join(lines)


def table(record: Dict[str, Any]) -> str:
  """The rows for the docs' performance page."""
  dev = record["devices"]
  lines = [f"Accelerator check ({'quick' if record['quick'] else 'full'}), {record['date']}: "
           f"{dev.get('count', '?')} x {dev.get('kind', '?')} ({dev.get('platform', '?')}), JAX {dev.get('jax', '?')}; "
           f"{record['sizes']['seeds']} seeds of {AGENT} on {ENV}, {record['sizes']['steps']} env steps each.", "",
           "| arm | wall (s) | notes |", "|---|---:|---|"]
  for name, arm in record["arms"].items():
    if arm.get("skipped"):
      note = f"skipped: {arm['skipped']}".replace("\n", " ").replace("|", "/")
    elif arm.get("timed_out"):
      note = "stopped at its time limit"
      if arm.get("steady_env_steps_per_second"):
        note += (f" (steady: {_rate(arm['steady_env_steps_per_second'])} env steps/s, "
                 f"{_rate(arm['steady_updates_per_second'])} updates/s)")
    elif not arm.get("ok"):
      note = "failed: " + arm.get("error", "")[-200:].replace("\n", " ").replace("|", "/")
    elif "seeds" in arm:
      note = (f"{arm['reached_475']}/{len(arm['seeds'])} seeds reached 475; compile {arm['compile_seconds']} s, "
              f"loop {arm['loop_seconds']} s; host {arm['host_seconds_per_run']} s a run")
    elif "loop_env_steps_per_second" in arm:
      note = (f"{arm['env_steps']} env steps: {arm['loop_env_steps_per_second']:,} env steps/s in the loop, "
              f"{arm['process_env_steps_per_second']:,} over the process")
    elif "inference_batch_mean" in arm:
      note = (f"{arm['env_steps']} env steps: {_rate(arm['env_steps_per_second'])} env steps/s, "
              f"{_rate(arm['updates_per_second'])} updates/s, inference batch mean {arm['inference_batch_mean']}; "
              f"learner {_devices(arm, 'learner')}, inference {_devices(arm, 'inference')}")
    elif "updates_per_second" in arm:
      note = (f"{arm['env_steps']} env steps: {_rate(arm['env_steps_per_second'])} env steps/s, "
              f"{_rate(arm['updates_per_second'])} updates/s; learner {_devices(arm, 'learner')}, "
              f"actor {_devices(arm, 'actor')}")
    else:
      note = "training returns (no evaluation)"
    lines.append(f"| {name} | {arm['wall_seconds'] if not arm.get('skipped') else '-'} | {note} |")
  embedded = [(name, record["arms"][name]) for name in EMBEDDED_ARMS if name in record["arms"]]
  if embedded:
    lines += ["", "Embedded DQN (`--deterministic`, 8 envs; run: the session's rates from summary.json, compilation "
                  "and the final evaluation included; steady: between the first and last learner metric rows):", "",
              "| arm | learner | actor | env steps/s (run) | updates/s (run) | env steps/s (steady) | "
              "updates/s (steady) |", "|---|---|---|---:|---:|---:|---:|"]
    for name, arm in embedded:
      if arm.get("skipped"):
        lines.append(f"| {name} | - | - | skipped | | | |")
        continue
      lines.append(f"| {name} | {_devices(arm, 'learner')} | {_devices(arm, 'actor')} | "
                   f"{_rate(arm.get('env_steps_per_second'))} | {_rate(arm.get('updates_per_second'))} | "
                   f"{_rate(arm.get('steady_env_steps_per_second'))} | {_rate(arm.get('steady_updates_per_second'))} |")
  lines += ["", "| figure | value |", "|---|---:|"]
  lines += [f"| {k} | {v} |" for k, v in record["figures"].items()]
  lines += ["", not_built(record)]
  return "\n".join(lines) + "\n"


def write(record: Dict[str, Any], out: str) -> None:
  record["figures"] = summarise(record)
  with open(os.path.join(out, "results.json"), "w") as f:
    json.dump(record, f, indent=1)
  with open(os.path.join(out, "table.md"), "w") as f:
    f.write(table(record))


class SkipReasons:
  """Why arms cannot run on this machine, each asked once and only when an arm needs it."""

  def __init__(self, found: Dict[str, Any]):
    self.accelerator = found.get("platform") not in (None, "cpu")
    self._atari: Optional[Tuple[Optional[str]]] = None
    self._launchpad: Optional[Tuple[Optional[str]]] = None

  def embedded(self, game: str, placement: str) -> Optional[str]:
    reasons = []
    if PLACEMENTS[placement][0] and not self.accelerator:
      reasons.append(NO_ACCELERATOR)
    if game == "atari":
      if self._atari is None:
        self._atari = (atari_missing(),)
      reasons += [r for r in self._atari if r]
    return "; ".join(reasons) or None

  def distributed(self) -> Optional[str]:
    if self._launchpad is None:
      self._launchpad = (launchpad_missing(),)
    reasons = ([] if self.accelerator else [NO_ACCELERATOR]) + [r for r in self._launchpad if r]
    return "; ".join(reasons) or None


# The full check fits a GPU session's 8 minutes. The quick arms are small and end on their own; their
# budget only guards against a hung arm, wide enough that a slow CPU (a 2-core box running DQN's
# updates at a quarter of another's speed ran the quick embedded arms in about 4 minutes) never
# cuts one short: an arm stopped by the clock is a figure missing, not a result.
FULL_BUDGET_SECONDS = 480.0
QUICK_BUDGET_SECONDS = 2400.0


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--quick", action="store_true", help="the same arms, small (any machine, a minute or two)")
  parser.add_argument("--out", default="accelerator-check", help="folder for results.json and table.md")
  parser.add_argument("--budget_seconds", type=float, default=None,
                      help=f"all arms together (default {FULL_BUDGET_SECONDS / 60:g} minutes, "
                           f"{QUICK_BUDGET_SECONDS / 60:g} with --quick)")
  parser.add_argument("--only", default="", help="comma-separated arms or groups (device, embedded, distributed) "
                                                  "to run (default: all)")
  args = parser.parse_args(argv)
  only = {arm for name in args.only.split(",") if name for arm in GROUPS.get(name, (name,))}
  unknown = sorted(only - {arm for arms in GROUPS.values() for arm in arms})
  if unknown:
    parser.error(f"--only: no arm named {', '.join(unknown)} (groups: {', '.join(GROUPS)})")
  if args.budget_seconds is None:
    args.budget_seconds = QUICK_BUDGET_SECONDS if args.quick else FULL_BUDGET_SECONDS
  sizes = Sizes(args.quick)
  os.makedirs(args.out, exist_ok=True)
  folder = tempfile.mkdtemp(prefix="accelerator-check-")
  deadline = time.monotonic() + args.budget_seconds
  record = {"date": time.strftime("%Y-%m-%d"), "quick": args.quick, "devices": devices(),
            "sizes": {"seeds": sizes.seeds, "steps": sizes.steps, "wide_envs": sizes.wide_envs,
                      "wide_steps": sizes.wide_steps, "embedded_steps": sizes.embedded_steps,
                      "embedded_min_replay": sizes.embedded_min_replay,
                      "embedded_updates_per_env_step": sizes.updates_per_env_step,
                      "distributed_steps": sizes.distributed_steps}, "arms": {}}
  print(f"accelerator check: {record['devices']}; runs in {folder}", flush=True)
  skips = SkipReasons(record["devices"])
  arms: List[Tuple[str, Callable[[float], Dict[str, Any]], Callable[[], Optional[str]]]] = [
      ("vmapped", lambda t: sweep_arm("vmapped", sizes, folder, t), lambda: None),
      ("purejaxrl", lambda t: purejaxrl_arm(sizes, sizes.seeds, 0, sizes.steps, t), lambda: None),
      ("wide_jrl", lambda t: wide_jrl_arm(sizes, folder, t), lambda: None),
      ("wide_purejaxrl", lambda t: purejaxrl_arm(sizes, 1, sizes.wide_envs, sizes.wide_steps, t), lambda: None),
      ("one_by_one", lambda t: sweep_arm("one_by_one", sizes, folder, t, ["--one_by_one"]), lambda: None)]
  for game in GAMES:
    for batch in BATCHES:
      for placement in PLACEMENTS:
        skip = lambda g=game, p=placement: skips.embedded(g, p)
        arms.append((embedded_name(game, batch, placement),
                     lambda t, g=game, b=batch, p=placement, why=skip: embedded_arm(g, b, p, sizes, folder, t, why()),
                     skip))
  arms.append(("distributed_dqn", lambda t: distributed_arm(sizes, folder, t, skips.distributed()), skips.distributed))
  for name, arm, skip in arms:
    if only and name not in only:
      continue
    left = deadline - time.monotonic()
    if left < 5 and not skip():  # a skipped arm is recorded as such, budget or not
      record["arms"][name] = {"wall_seconds": 0.0, "ok": False, "timed_out": True}
      continue
    record["arms"][name] = arm(max(min(left, sizes.cap_shares[name] * args.budget_seconds), 1.0))
    write(record, args.out)
    done = record["arms"][name]
    status = f"skipped: {done['skipped']}" if done.get("skipped") else "ok" if done["ok"] else "NOT OK"
    print(f"{name:30s} {done['wall_seconds']:8.1f} s {status}", flush=True)
  write(record, args.out)
  print(table(record), flush=True)
  return 0 if all(a["ok"] for a in record["arms"].values() if not a.get("skipped")) else 1


if __name__ == "__main__":
  sys.exit(main())
