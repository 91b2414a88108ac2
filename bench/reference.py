"""The reference table: DQN and PPO on four MinAtar games, three seeds each, beside published values.

  make reference [AGENT=ppo|dqn|all] [STEPS=1000000]
  .venv/bin/python bench/reference.py --agent ppo [--steps 1000000] [--games breakout,asterix] [--seeds 0-2]
  .venv/bin/python bench/reference.py --table        # only rebuild docs/results.md from docs/results/*.json

Each (agent, game) is one `python -m launch.sweep` (its rliable report lands in the sweep's
folder under --run_dir). The agents run the way their published anchors were measured:

- PPO: gymnax-blines' settings (an MLP of 256x2 on the flattened planes, 64 envs, 128 steps,
  8 minibatches, 4 epochs, lr 5e-4, discount 0.999, GAE 0.95, entropy 0.01, gradient norm 0.5;
  its learning-rate "warm-up" goes from 5e-4 to 5e-4, a constant) on gymnax's MinAtar ports,
  through the device backend with the three seeds in one vmapped program (gymnax-blines trained
  on those ports too); evaluations sample the policy, as gymnax-blines' test rollouts do.
- DQN: the MinAtar paper's environment (the `minatar` package: sticky actions 0.1) through the
  embedded runner with its seeded replay (`--deterministic`: sampling and inserts in the run's
  own thread, no Reverb server or sampler thread contending for its core), two games at a time,
  each on a core of its own with XLA on one thread (`--one_core_each`: a pinned run was about as
  fast as one run alone on both cores; bench/sweep_cores.py),
  with the paper's 1-step targets from the target network's max (not double Q), MinAtar's small
  CNN, replay 100k, target period 1000, epsilon 1 to 0.1 over 100k steps and Adam 2.5e-4 (the paper:
  centred RMSProp); the paper trains every step on 32 samples (a sample/insert ratio of 32), this
  runs 8.

Scores are evaluations of 32 episodes every `--eval_every` steps (DQN's greedy, PPO's sampling
its policy): the final one and the best over the run. The published values are read from the
papers' learning curves at the same budget (the MinAtar paper's are not greedy evaluations:
DQN's comparison is indicative).
Each finished game's per-run rows go to docs/results/reference-<agent>-<steps>.json (date, commit,
machine, command) as soon as its sweep ends, and docs/results.md is rebuilt from them.
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
RESULTS_DIR = os.path.join(ROOT, "docs", "results")
RESULTS_PAGE = os.path.join(ROOT, "docs", "results.md")
# What was tried where a row was below its anchor: the page's last section, markdown written by hand.
BELOW_ANCHORS = os.path.join(RESULTS_DIR, "below-anchors.txt")

GAMES = {"breakout": "Breakout", "asterix": "Asterix", "freeway": "Freeway", "spaceinvaders": "SpaceInvaders"}

# gymnax-blines' own training logs of the PPO runs its README's curves plot (docs/lcurves.png, drawn
# by notebooks/visualize_lcurves.ipynb from agents/<Game>-MinAtar/ppo.pkl at commit 3f029d6: the
# lr 5e-4 run of ppo.yaml, 64 envs, one seed): "log_steps" -> "log_return", each the mean of 164 test
# rollouts that sample the policy, logged every 320,000 env steps; the points around the budgets.
GYMNAX_BLINES_PPO_LOG = {
    "breakout": {959_936: 16.634, 1_279_936: 15.713, 9_919_936: 22.884},
    "asterix": {959_936: 1.799, 1_279_936: 2.140, 9_919_936: 14.951},
    "freeway": {959_936: 29.043, 1_279_936: 30.250, 9_919_936: 58.805},
    "spaceinvaders": {959_936: 50.378, 1_279_936: 58.378, 9_919_936: 131.640},
}


def logged_at(log: Dict[int, float], steps: int) -> float:
  """A training log's return at `steps` env steps: linear between the logged points around it, the
  last point's beyond the log's end (its last is at 9,919,936), to two decimals."""
  points = sorted(log.items())
  if steps >= points[-1][0]:
    return round(points[-1][1], 2)
  if steps <= points[0][0]:
    return round(points[0][1], 2)
  (s0, r0), (s1, r1) = next((a, b) for a, b in zip(points, points[1:]) if a[0] <= steps <= b[0])
  return round(r0 + (r1 - r0) * (steps - s0) / (s1 - s0), 2)


# Published returns at a budget of env steps: DQN's read from the MinAtar paper's curves, PPO's from
# gymnax-blines' logs (above). Until 2026-12-06 PPO's were read from gymnax-blines' figure too:
# 15, 2, 30 and 55 at 1M; 28, 15, 58 and 131 at 10M.
PUBLISHED: Dict[str, Dict[str, Any]] = {
    "dqn": {"source": "MinAtar paper's DQN (Young & Tian, 2019; 30 seeds, sticky actions 0.1), read from its curves",
            "at": {1_000_000: {"breakout": 9, "asterix": 7, "freeway": 48, "spaceinvaders": 35},
                   5_000_000: {"breakout": 10, "asterix": 17, "freeway": 50, "spaceinvaders": 43}}},
    "ppo": {"source": "gymnax-blines' PPO (MLP 256x2, 64 envs, lr 5e-4, one seed): the training log its curves plot "
                      "(`agents/<Game>-MinAtar/ppo.pkl` at commit 3f029d6), linear between the evaluations logged "
                      "at 959,936 and 1,279,936 env steps for 1M, its last (9,919,936) for 10M",
            "at": {steps: {game: logged_at(log, steps) for game, log in GYMNAX_BLINES_PPO_LOG.items()}
                   for steps in (1_000_000, 10_000_000)}},
}

# Each agent's row settings are its `minatar` preset (jrl/agents/<agent>/presets.yaml): the sweeps run
# `--preset minatar`; a record keeps the preset's flags, which its settings are compared by.
PRESET = "minatar"


def preset_flags(agent: str) -> List[str]:
  from jrl.agents import get_agent
  from jrl.experiment.presets import find_preset
  return find_preset(PRESET, agent, get_agent(agent)).argv()


SETTINGS = {
    "ppo": {"env": "gymnax:{name}-MinAtar", "flags": preset_flags("ppo")},
    "dqn": {"env": "MinAtar/{name}-v1", "flags": preset_flags("dqn")},
}


# How each agent's sweeps share the machine (not part of the settings a record is compared by):
# `lanes` games at once, each lane a core of its own running its game's seeds one after another
# (`--one_core_each`: XLA on one thread), or one game at a time on the whole machine.
EXECUTION = {"ppo": {"lanes": 1, "flags": []}, "dqn": {"lanes": 2, "flags": ["--one_core_each"]}}


def run_sweep(agent: str, game: str, args, run_root: str, core: Optional[int] = None) -> Dict[str, Any]:
  """One agent on one game over the seeds (on `core` alone, if given): the sweep's command, wall
  time and folder."""
  settings, lanes = SETTINGS[agent], EXECUTION[agent]["lanes"]
  env = settings["env"].format(name=GAMES[game])
  folder = os.path.join(run_root, f"{agent}-{game}")
  command = [sys.executable, "-m", "launch.sweep", "--agent", agent, "--env", env, "--seeds", args.seeds,
             "--run_dir", folder, *EXECUTION[agent]["flags"], "--steps", str(args.steps),
             "--eval_every", str(args.eval_every), "--eval_episodes", "32", "--progress_seconds", "60",
             "--preset", PRESET]
  print(f"[reference] {agent} on {env}{f' (core {core})' if core is not None else ''}: {' '.join(command[1:])}",
        flush=True)
  measured = {"date": datetime.date.today().isoformat(), "commit": commit()}  # the code the sweep runs
  start = time.monotonic()
  # The sweep runs where it may: on its lane's core (its --one_core_each pins its runs there).
  pin = None if core is None else (lambda: os.sched_setaffinity(0, {core}))
  done = subprocess.run(command, cwd=ROOT, preexec_fn=pin)
  wall = time.monotonic() - start
  if done.returncode != 0:
    print(f"[reference] {agent} on {env}: the sweep exited {done.returncode}", flush=True)
  return {**measured, "env": env, "folder": folder, "wall_seconds": round(wall, 1), "returncode": done.returncode,
          "lanes": lanes, "command": " ".join(["python"] + command[1:]).replace(run_root, "RUN_DIR")}


def run_agent(agent: str, games: List[str], args, run_root: str) -> None:
  """The agent's games, `lanes` at a time; each game's rows are written as its sweep ends (a long
  run shows as it goes)."""
  from launch.sweep import usable_cores
  lanes = EXECUTION[agent]["lanes"]
  cores = usable_cores()[:lanes] if lanes > 1 else [None]
  if lanes > 1 and len(cores) < lanes:
    raise SystemExit(f"reference.py: {agent} runs {lanes} games at once, a core each; this machine lets it use "
                     f"{len(cores)}")
  queue, lock = list(games), threading.Lock()

  def lane(core: Optional[int]) -> None:
    while True:
      with lock:
        if not queue:
          return
        game = queue.pop(0)
      sweep = run_sweep(agent, game, args, run_root, core)
      rows = collect(agent, game, sweep)
      with lock:
        path = write_results(agent, args.steps, rows, [sweep["command"]])
        print(f"[reference] {agent} on {game}: {path}; {rebuild_page()}", flush=True)

  threads = [threading.Thread(target=lane, args=(core,), name=f"lane-{core}") for core in cores]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()


def collect(agent: str, game: str, sweep: Dict[str, Any]) -> List[Dict[str, Any]]:
  """Per-run rows of a finished sweep (seeds that failed are kept, with their error)."""
  from jrl.experiment import sweep_report
  rows = []
  runs = sweep_report.load_runs([sweep["folder"]])
  for run in runs:
    rows.append({"agent": agent, "game": game, "env": sweep["env"], "seed": run.seed, "complete": run.complete,
                 "final": run.final_return, "best": run.best_return, "env_steps": run.env_steps,
                 "run_wall_seconds": run.wall_seconds, "sweep_wall_seconds": sweep["wall_seconds"],
                 "runs_in_sweep": len(runs), "lanes": sweep["lanes"], "error": run.error, "date": sweep["date"],
                 "commit": sweep["commit"]})
  return rows


def machine() -> str:
  try:
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
  except (ValueError, OSError):
    mem = float("nan")
  return f"{os.cpu_count()} CPU cores{cpu_model()}, {mem:.0f} GiB, no GPU ({platform.machine()})"


def cpu_model() -> str:
  """` (the processor's name)` where Linux says it: boxes of the same core count differ several times
  in speed, and a row's wall time means little without it."""
  try:
    with open("/proc/cpuinfo") as f:
      name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
  except OSError:
    return ""
  return f" ({name})" if name else ""


def commit() -> str:
  done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
  return done.stdout.strip() or "unknown"


def write_results(agent: str, steps: int, rows: List[Dict[str, Any]], commands: List[str]) -> str:
  """The agent's record at this budget, with these games' rows (and commands) replacing theirs
  in the record already there when it was measured with the same settings: the games of a
  budget can be measured in separate sessions. Each row keeps its own date and commit; a run the
  sweep reused (a seed finished in an earlier session, the same returns and steps) keeps its
  row's date, commit and sweep wall time."""
  os.makedirs(RESULTS_DIR, exist_ok=True)
  path = os.path.join(RESULTS_DIR, f"reference-{agent}-{steps}.json")
  today, at = datetime.date.today().isoformat(), commit()
  rows = [dict(row, date=row.get("date", today), commit=row.get("commit", at)) for row in rows]
  if os.path.exists(path):
    with open(path) as f:
      old = json.load(f)
    # ("parallel" was a setting until the lanes of EXECUTION: how the runs shared the machine.)
    if {k: v for k, v in old.get("settings", {}).items() if k != "parallel"} == SETTINGS[agent]:
      earlier = {(row["game"], row["seed"]): row for row in old["runs"]}
      rows = [_as_measured(row, earlier.get((row["game"], row["seed"]))) for row in rows]
      games = {row["game"] for row in rows}
      kept = [dict(row, date=row.get("date", old["date"]), commit=row.get("commit", old["commit"]))
              for row in old["runs"] if row["game"] not in games]
      envs = {SETTINGS[agent]["env"].format(name=GAMES[g]) for g in games}
      kept_commands = [c for c in old["commands"] if not any(f"--env {env} " in c for env in envs)]
      rows, commands = kept + rows, kept_commands + commands
  order = list(GAMES)
  rows.sort(key=lambda row: (order.index(row["game"]), row["seed"]))
  commands.sort(key=lambda c: next((i for i, g in enumerate(GAMES.values()) if f"/{g}-" in c or f":{g}-" in c), 0))
  record = {"agent": agent, "steps": steps, "date": today, "commit": at,
            "machine": machine(), "settings": SETTINGS[agent], "commands": commands, "runs": rows}
  with open(path, "w") as f:
    json.dump(record, f, indent=1)
  return path


def _as_measured(row: Dict[str, Any], earlier: Optional[Dict[str, Any]]) -> Dict[str, Any]:
  """A row of this sweep; where it is a run reused from an earlier session's row, when and at
  what commit and sweep wall time that run was measured."""
  same_run = earlier is not None and earlier.get("complete") and all(
      earlier.get(key) == row.get(key) for key in ("final", "best", "env_steps", "run_wall_seconds"))
  if not same_run:
    return row
  # (rows written before lanes had the whole machine: lanes 1)
  return dict(row, lanes=earlier.get("lanes", 1), **{key: earlier[key] for key in
                                                      ("date", "commit", "sweep_wall_seconds", "runs_in_sweep")
                                                      if key in earlier})


# ----------------------------------------------------------------------------- the table

def _estimate(values: List[float]) -> str:
  from jrl.experiment import sweep_report
  import numpy as np
  if not values:
    return "-"
  est = sweep_report.aggregates(np.asarray(values, np.float64)[:, None], reps=20_000)
  point, low, high = est["mean"]
  return f"{point:.1f} [{low:.1f}, {high:.1f}]"


def short_command(command: str, agent: str) -> str:
  """A recorded command as the preset writes it: the preset's flags, where the command spells them
  out (records made before the presets), become `--preset NAME`."""
  spelled = " " + " ".join(SETTINGS[agent]["flags"])
  return command.replace(spelled, f" --preset {PRESET}") if command.endswith(spelled) else command


def render_table(records: List[Dict[str, Any]]) -> str:
  """docs/results.md from the committed records: one table per (agent, budget)."""
  lines = ["# Reference results", "",
           "DQN and PPO on four MinAtar games, three seeds each, beside the published values at the same",
           "budget. Rebuilt by `.venv/bin/python bench/reference.py --table` from the per-run records in",
           "`docs/results/` (each written by `make reference AGENT=...`, whose docstring gives the settings).", "",
           "Scores are evaluations of 32 episodes: the final one and the best of the run; mean over the",
           "seeds with a 95% bootstrap CI (rliable, 20,000 resamples; with three seeds the IQM is the mean).",
           "DQN's evaluations are greedy. PPO's sample the policy (its preset's `greedy_eval: false`), as",
           "gymnax-blines' test rollouts, its anchor, do. DQN's published values are read from the MinAtar",
           "paper's learning curves, which are not greedy evaluations: DQN's comparison is indicative. PPO's",
           "are gymnax-blines' own training log, the data its curves plot, at the same budget.",
           "Wall times are the whole sweep's (start to exit, compilation included; summed where a",
           "game's seeds ran in more than one sweep). A run's share of the machine is the sweep's wall",
           "over its runs, halved where two games' sweeps ran at once, a core each (DQN: two lanes,",
           "each running its games' seeds one after another); PPO's vmapped seeds share one program on",
           "the whole machine.", ""]
  for record in sorted(records, key=lambda r: (r["agent"], r["steps"])):
    agent, steps = record["agent"], record["steps"]
    published = PUBLISHED[agent]["at"].get(steps, {})
    measured = sorted({(row.get("date", record["date"]), row.get("commit", record["commit"]))
                       for row in record["runs"]})
    when = ", ".join(f"{date} at commit `{at}`" for date, at in measured)
    lines += [f"## {agent.upper()} at {steps:,} env steps", "",
              f"Measured {when} on {record['machine']}. "
              f"Published: {PUBLISHED[agent]['source']}.", "",
              "| game | env | seeds | final [95% CI] | best [95% CI] | published | final / published | "
              "sweep wall s | machine s per run |",
              "|---|---|---|---|---|---|---|---|---|"]
    for game in GAMES:
      rows = [r for r in record["runs"] if r["game"] == game]
      if not rows:
        continue
      ok = [r for r in rows if r["complete"]]
      finals = [r["final"] for r in ok]
      bests = [r["best"] for r in ok]
      ref = published.get(game)
      ratio = f"{sum(finals) / len(finals) / ref:.2f}" if finals and ref else "-"
      # A game's seeds may have run in several sweeps (sessions): their walls add up. A sweep that
      # ran in one of `lanes` lanes had that share of the machine.
      sweeps = {(r.get("date"), r.get("commit"), r["sweep_wall_seconds"], r.get("lanes", 1)) for r in rows}
      sweep_wall = sum(wall for _, _, wall, _ in sweeps)
      machine = sum(wall / lanes for _, _, wall, lanes in sweeps)
      # A sweep's machine time went to the runs that completed (a run not completed never started).
      lines.append(f"| {GAMES[game]} | `{rows[0]['env']}` | {len(ok)}/{len(rows)} | {_estimate(finals)} | "
                   f"{_estimate(bests)} | {ref if ref is not None else '-'} | {ratio} | {sweep_wall:.0f} | "
                   f"{machine / max(1, len(ok)):.0f} |")
    lines += ["", f"Commands (`RUN_DIR` the folder given to `bench/reference.py --run_dir`; `--preset {PRESET}` "
                  f"is `{' '.join(SETTINGS[agent]['flags'])}`):", ""]
    lines += [f"    {short_command(c, agent)}" for c in record["commands"]]
    lines.append("")
  if os.path.exists(BELOW_ANCHORS):
    with open(BELOW_ANCHORS) as f:
      lines += f.read().splitlines() + [""]
  missing = sorted(set(SETTINGS) - {r["agent"] for r in records})
  for agent in missing:
    lines += [f"## {agent.upper()}", "", f"Not recorded yet: `make reference AGENT={agent}` runs it (settings in "
              "`bench/reference.py`).", ""]
  return "\n".join(lines) + "\n"


def rebuild_page() -> str:
  records = []
  if os.path.isdir(RESULTS_DIR):
    for name in sorted(os.listdir(RESULTS_DIR)):
      if name.startswith("reference-") and name.endswith(".json"):
        with open(os.path.join(RESULTS_DIR, name)) as f:
          records.append(json.load(f))
  page = render_table(records)  # (its bootstrap takes a while: the page is not left empty meanwhile)
  with open(RESULTS_PAGE, "w") as f:
    f.write(page)
  return RESULTS_PAGE


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--agent", default="all", choices=["all", *SETTINGS])
  parser.add_argument("--steps", type=int, default=1_000_000)
  parser.add_argument("--games", default=",".join(GAMES), help="comma-separated: " + ", ".join(GAMES))
  parser.add_argument("--seeds", default="0-2")
  parser.add_argument("--eval_every", type=int, default=50_000)
  parser.add_argument("--run_dir", default=None, help="where the sweeps go (default runs/reference-<time>)")
  parser.add_argument("--table", action="store_true", help="only rebuild docs/results.md from docs/results/")
  args = parser.parse_args()
  if not args.table:
    games = [g.strip().lower() for g in args.games.split(",") if g.strip()]
    unknown = [g for g in games if g not in GAMES]
    if unknown:
      parser.exit(2, f"reference.py: error: --games: unknown {', '.join(unknown)} (known: {', '.join(GAMES)})\n")
    run_root = os.path.abspath(args.run_dir or os.path.join(
        "runs", "reference-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S")))
    for agent in (list(SETTINGS) if args.agent == "all" else [args.agent]):
      run_agent(agent, games, args, run_root)
  print(f"[reference] {rebuild_page()}", flush=True)


if __name__ == "__main__":
  main()
