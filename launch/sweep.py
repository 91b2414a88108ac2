"""Run one agent on one env over several seeds, then write a report over them.

  python -m launch.sweep --agent dqn --env CartPole-v1 --seeds 0-4 --run_dir DIR [--parallel K] [any train flag]

Each seed is a `python -m launch.train` subprocess with its own run directory
`DIR/<agent>-<env>-s<seed>`, at most K at a time (default 1); its output goes to
`DIR/logs/` and is echoed. A seed that fails is reported and the others go on. Then
`DIR/report.md`, `DIR/report.json` and PNGs (see jrl.experiment.sweep_report); `DIR/sweep.json`
records each seed's run directory and outcome. Seeds: `0-4`, `0,2,5`, `3`, or mixed (`0-2,7`).
Train flags (`--steps 20000 --deterministic --hidden_sizes 64,64`) are checked by launch.train's
own parser before any seed starts. Exit status: 0 when every seed finished, 1 when some failed,
2 for bad input (nothing run).

With `--backend device` every seed runs in this process, in one compiled program (the device
loop vmapped over seeds: `jrl.run.device.sweep`), into the same run directories; `--one_by_one`
runs them as separate launch.train processes instead.

`--one_core_each` pins each of the K runs at once to a core of its own, with XLA's CPU backend on
one thread and its whole-program (legacy) runtime (ONE_CORE_XLA_FLAGS). On a CPU machine, small
networks' updates spread over every core spend more in thread hand-offs than they gain, so K
pinned runs on K cores do more in all than K runs sharing them (bench/sweep_cores.py measures it).
Pinning changes the float reduction order: a pinned run is not bitwise the same as an unpinned one.
"""

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, List, NamedTuple, Optional, Sequence

from jrl import accelerators
from launch.cli import OneLineParser, build_config, end_process, fail, given_fields, with_preset

PROG = "python -m launch.sweep"
_OWNED = ("seed", "run_dir", "resume")  # set by the sweep for each seed
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# XLA's CPU settings of a run pinned to one core (--one_core_each): no Eigen thread pool, and the
# whole-program runtime (bench/sweep_cores.py --update_ms). Only `--name=value` tokens: a token
# without the dashes in XLA_FLAGS made XLA ignore the flags after it (the runtime went unchanged).
ONE_CORE_XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false --xla_cpu_use_thunk_runtime=false"
_finished_sweep = False  # set once a sweep's record, report and runs are written (`cli.end_process`)


class Job(NamedTuple):
  seed: int
  name: str             # run directory's name inside the sweep folder
  command: List[str]
  point: Optional[Dict[str, float]] = None  # the grid point (agent config fields), if any


class Outcome(NamedTuple):
  seed: int
  name: str
  returncode: int
  seconds: float
  error: str            # why it failed ("" when it finished)
  point: Optional[Dict[str, float]] = None


def parse_args(argv: Sequence[str]):
  """(sweep args, train flags) after checking both; exits 2 with one line on bad input."""
  from jrl.errors import ConfigError
  from jrl.experiment import files, sweep_report
  parser = OneLineParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--agent", default="dqn", help="agent name or module (default dqn)")
  parser.add_argument("--env", default="CartPole-v1", help="env id (default CartPole-v1)")
  parser.add_argument("--seeds", required=True, help="seeds: 0-4, 0,2,5, 3 or 0-2,7")
  parser.add_argument("--run_dir", default="", help="sweep folder (default runs/sweep-<agent>-<env>-<time>)")
  parser.add_argument("--parallel", type=int, default=1, help="seeds run at once (default 1)")
  parser.add_argument("--one_core_each", action="store_true",
                      help="pin each of the --parallel runs to a core of its own, XLA on one thread (CPU machines)")
  parser.add_argument("--reps", type=int, default=sweep_report.DEFAULT_REPS,
                      help=f"bootstrap resamples of the IQM/mean CIs (default {sweep_report.DEFAULT_REPS})")
  parser.add_argument("--bootstrap_seed", type=int, default=0, help="seed of the bootstrap (default 0)")
  parser.add_argument("--grid", action="append", default=[], metavar="FIELD=V1,V2,...",
                      help="--backend device: a hyperparameter of the agent's config to sweep, crossed with the "
                           "seeds and the other --grid fields, as traced values of the one program (repeatable)")
  parser.add_argument("--one_by_one", action="store_true",
                      help="--backend device: one launch.train process per seed instead of all seeds in one "
                           "vmapped program")
  args, train_argv = parser.parse_known_args(argv)
  try:
    args.seed_list = sweep_report.parse_seeds(args.seeds)
    if args.parallel < 1:
      raise ConfigError("parallel", f"must be >= 1, got {args.parallel}")
    if args.reps < 1:
      raise ConfigError("reps", f"must be >= 1, got {args.reps}")
    for token in train_argv:
      name = token[2:].split("=", 1)[0] if token.startswith("--") else ""
      if name in _OWNED:
        raise ConfigError(name, "is set by the sweep for each seed (use --seeds and the sweep's --run_dir)")
    if not args.run_dir:
      args.run_dir = "runs/" + files.path_safe(time.strftime(f"sweep-{args.agent}-{args.env}-%Y%m%d-%H%M%S"))
    args.run_dir = os.path.abspath(args.run_dir)  # resolved once: each seed's process gets the same folder
    if os.path.exists(args.run_dir) and not os.path.isdir(args.run_dir):
      raise ConfigError("run_dir", f"'{args.run_dir}' is an existing file, not a folder")
    if os.path.isfile(os.path.join(args.run_dir, "config.json")):
      raise ConfigError("run_dir", f"'{args.run_dir}' is a run, not a sweep folder")
    exp, agent_cfg = check_train_flags(args.agent, args.env, args.seed_list[0], train_argv)
    args.vmapped = exp.mode == "device" and not args.one_by_one
    if args.vmapped and args.parallel != 1:
      raise ConfigError("parallel", "--backend device runs every seed in one vmapped program; "
                                    "add --one_by_one to run them as processes")
    if args.one_core_each:
      if args.vmapped:
        raise ConfigError("one_core_each", "pins the runs of --parallel to cores; a vmapped device sweep is one "
                                           "process (add --one_by_one to run the seeds as processes)")
      cores = usable_cores()
      if args.parallel > len(cores):
        raise ConfigError("one_core_each", f"--parallel {args.parallel} runs need as many cores; this process may "
                                           f"use {len(cores)}")
    if args.vmapped:
      from jrl.run.device.sweep import check_one_process
      from jrl.gymnax_envs import GymnaxVecEnv
      check_one_process(exp)
      GymnaxVecEnv(exp.env)  # ConfigError for an id gymnax does not have, before anything is written
    grid = parse_grid(args.grid)
    if grid and not args.vmapped:
      raise ConfigError("grid", "sweeps hyperparameters inside one vmapped device program: needs --backend device "
                                "(without --one_by_one)")
    if grid:
      from jrl.run.device.sweep import check_grid, grid_points
      check_grid(exp, agent_cfg, grid)
    args.points = grid_points(grid) if grid else [None]
    args.runs = [(seed, point) for point in args.points for seed in args.seed_list]
    args.continued = []
    args.reused = finished_earlier(args.run_dir, exp, agent_cfg, args.runs, args.continued if args.vmapped else None)
    if args.continued and len(args.continued) != len(args.runs) - len(args.reused):
      raise ConfigError("run_dir", f"some unfinished runs in '{args.run_dir}' have a checkpoint and some do not; "
                                   "a vmapped sweep continues all of them or none (remove the others)")
    args.exp, args.agent_cfg = exp, agent_cfg
  except ConfigError as e:
    fail(PROG, e)
  return args, train_argv


def check_train_flags(agent_name: str, env: str, seed: int, train_argv: Sequence[str]):
  """Everything launch.train checks before it starts, on one seed's command line: an unknown
  agent, flag or env, a bad value. argparse errors exit 2 here; the rest raise ConfigError.
  Returns that seed's (experiment config, agent config)."""
  from jrl.agents import get_agent
  from jrl.experiment.config import ExperimentConfig
  from launch.train import make_parser
  agent = get_agent(agent_name)
  parser = make_parser(agent_name, agent, prog=PROG)
  args = parser.parse_args(with_preset(["--agent", agent_name, "--env", env, "--seed", str(seed), *train_argv],
                                       agent_name, agent))
  exp = build_config(ExperimentConfig, args)
  agent_cfg = build_config(agent.Config, args)
  exp.check_given_flags(given_fields(ExperimentConfig, args))
  if exp.mode != "device":  # device runs check their gymnax env id themselves
    from jrl.envs import check_env_id
    check_env_id(exp.env)
  return exp, agent_cfg


def _comparable(payload: Dict) -> Dict:
  """A config.json payload as JSON values, without the run directory (the same run may be named
  by another path)."""
  data = json.loads(json.dumps(payload))  # tuples -> lists, as in config.json
  data.get("experiment", {}).pop("run_dir", None)
  return data


def parse_grid(specs: Sequence[str]) -> Dict[str, List[float]]:
  """--grid FIELD=V1,V2,... (repeatable) -> {field: values}; ConfigError('grid') for a bad one."""
  from jrl.errors import ConfigError
  grid: Dict[str, List[float]] = {}
  for spec in specs:
    name, _, values = spec.partition("=")
    try:
      numbers = [float(v) for v in values.split(",")]
    except ValueError:
      numbers = []
    if not name or not numbers or name in grid:
      raise ConfigError("grid", f"expected FIELD=V1,V2,... with numbers, each field once, got '{spec}'")
    grid[name] = numbers
  return grid


def finished_earlier(sweep_dir: str, exp, agent_cfg, runs: Sequence[tuple],
                     continued: Optional[List[tuple]] = None) -> List[tuple]:
  """The (seed, grid point) runs whose run directory already holds a finished run with this
  sweep's settings: they are reused, so a sweep can be extended (0-2, then 0-4). With `continued`
  (a vmapped sweep) the runs with this sweep's settings that stopped after a checkpoint are added
  to it: the sweep continues them. Any other run already there is a ConfigError naming it
  (launch.train would refuse it)."""
  from jrl.errors import ConfigError
  from jrl.experiment.files import check_run_dir_target, config_payload
  from jrl.experiment.sweep_report import run_dir_name
  reused = []
  for seed, point in runs:
    run_dir = os.path.join(sweep_dir, run_dir_name(exp.agent, exp.env, seed, point))
    if not os.path.isfile(os.path.join(run_dir, "config.json")):
      continue
    try:
      if check_run_dir_target(run_dir):  # stopped before its first checkpoint: launch.train starts it over
        continue
    except ConfigError:
      pass
    try:
      with open(os.path.join(run_dir, "config.json")) as f:
        saved = _comparable(json.load(f))
    except (OSError, ValueError):
      saved = None
    wanted = _comparable(config_payload(dataclasses.replace(exp, seed=seed),
                                        dataclasses.replace(agent_cfg, **(point or {}))))
    if saved == wanted and os.path.isfile(os.path.join(run_dir, "summary.json")):
      reused.append((seed, point))
      continue
    if saved == wanted and continued is not None:
      continued.append((seed, point))
      continue
    state = "with other settings" if saved != wanted else "that did not finish"
    raise ConfigError("run_dir", f"'{run_dir}' already holds a run {state}; remove it, pick another --run_dir, "
                                 f"or report on what is there with python -m launch.report {sweep_dir}")
  return reused


def plan(agent: str, env: str, runs: Sequence[tuple], sweep_dir: str, train_argv: Sequence[str]) -> List[Job]:
  """One job per (seed, grid point). A grid point's runs exist only in a vmapped sweep, which runs
  its jobs in this process (`run_vmapped`), not their commands."""
  from jrl.experiment.sweep_report import run_dir_name
  jobs = []
  for seed, point in runs:
    name = run_dir_name(agent, env, seed, point)
    jobs.append(Job(seed, name, [sys.executable, "-m", "launch.train", "--agent", agent, "--env", env,
                                 "--seed", str(seed), "--run_dir", os.path.join(sweep_dir, name), *train_argv],
                    point))
  return jobs


def usable_cores() -> List[int]:
  """The CPU cores this process may run on."""
  try:
    return sorted(os.sched_getaffinity(0))
  except AttributeError:  # not Linux
    return list(range(os.cpu_count() or 1))


def one_core_env(env: Dict[str, str]) -> Dict[str, str]:
  """`env` for a run pinned to one core: ONE_CORE_XLA_FLAGS after the user's own XLA_FLAGS."""
  return dict(env, XLA_FLAGS=" ".join(f for f in (env.get("XLA_FLAGS", ""), ONE_CORE_XLA_FLAGS) if f))


class _Child:
  """One seed's subprocess (on `core` alone, if given); a thread copies its output to the log and to
  our stdout."""

  def __init__(self, job: Job, log_path: str, env: Dict[str, str], core: Optional[int] = None):
    self.job, self.core = job, core
    self.started = time.monotonic()
    self.error_line = ""
    self.last_line = ""
    self._log = open(log_path, "w")
    pin = None if core is None else (lambda: os.sched_setaffinity(0, {core}))  # in the child, before exec
    self.process = subprocess.Popen(job.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    bufsize=1, env=one_core_env(env) if core is not None else env,
                                    preexec_fn=pin)
    self._reader = threading.Thread(target=self._copy, name=f"sweep-s{job.seed}", daemon=True)
    self._reader.start()

  def _copy(self) -> None:
    for line in self.process.stdout:
      if self._log.closed:  # finish() gave up waiting (a grandchild holds the pipe open)
        return
      self._log.write(line)
      self._log.flush()
      text = line.rstrip()
      if text:
        self.last_line = text
        if "error:" in text:  # launch.train's one-line errors
          self.error_line = text
        if text.startswith("["):  # the run's progress lines; everything else stays in the log
          print(text, flush=True)

  def finish(self) -> Outcome:
    self._reader.join(timeout=10)
    self._log.close()
    code = self.process.returncode
    seconds = time.monotonic() - self.started
    error = ""
    if code != 0:
      why = f"killed by signal {-code}" if code < 0 else f"exit {code}"
      detail = self.error_line or self.last_line  # a traceback ends with the exception's line
      error = f"{why}: {detail}" if detail else why
    return Outcome(self.job.seed, self.job.name, code, seconds, error, self.job.point)


def run_jobs(jobs: Sequence[Job], parallel: int, log_dir: str, on_done, one_core_each: bool = False,
             host: Optional[accelerators.Accelerators] = None) -> List[Outcome]:
  """Runs the jobs, at most `parallel` at once (each on a free core of its own with
  `one_core_each`; on a GPU host each in a slot of `jrl.accelerators.place_sweep`: a GPU of its own
  where there are `parallel`; `host`: this host's accelerators, found when not given), calling
  `on_done(outcome)` as each ends."""
  host = accelerators.host_accelerators() if host is None else host
  slots = accelerators.place_sweep(host, parallel, os.environ.get("JAX_PLATFORMS", ""))
  os.makedirs(log_dir, exist_ok=True)
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(p for p in (_REPO_ROOT, env.get("PYTHONPATH", "")) if p)
  pending, running, outcomes = list(jobs), [], []
  cores = usable_cores()[:parallel] if one_core_each else []
  try:
    while pending or running:
      while pending and len(running) < parallel:
        job = pending.pop(0)
        core = next(c for c in cores if c not in {r.core for r in running}) if one_core_each else None
        slot = slots[next(i for i in range(parallel) if i not in {r.slot for r in running})]
        on = (f" on core {core}" if core is not None else "") + (f" on {slot.describe()}" if slot.devices else "")
        print(f"[sweep] seed {job.seed}: started ({len(outcomes) + len(running) + 1}/{len(jobs)}){on}, "
              f"log {os.path.join(log_dir, job.name + '.log')}", flush=True)
        running.append(_Child(job, os.path.join(log_dir, job.name + ".log"), {**env, **slot.env}, core))
        running[-1].slot = slot.index
      time.sleep(0.2)
      for child in [c for c in running if c.process.poll() is not None]:
        running.remove(child)
        outcome = child.finish()
        outcomes.append(outcome)
        on_done(outcome)
  except KeyboardInterrupt:
    for child in running:
      child.process.terminate()
    for child in running:
      child.process.wait()
      outcomes.append(child.finish())
    raise
  return outcomes


def run_vmapped(args, jobs: Sequence[Job], on_done) -> None:
  """The seeds of `jobs` as one vmapped device program in this process (`jrl.run.device.sweep`)."""
  if not jobs:
    return
  from jrl.run.device.sweep import run_device_sweep
  print(f"[sweep] seeds {', '.join(str(j.seed) for j in jobs)}: one vmapped device program", flush=True)
  started = time.monotonic()
  exp = args.exp
  if args.continued:  # every run left unfinished has a checkpoint: the one program continues them all
    print(f"[sweep] {len(args.continued)} runs continue from their checkpoints", flush=True)
    exp = dataclasses.replace(exp, resume="checkpoints")
  try:
    run_device_sweep(exp, args.agent_cfg, [j.seed for j in jobs],
                     [os.path.join(args.run_dir, j.name) for j in jobs], points=[j.point or {} for j in jobs])
    code, error = 0, ""
  except Exception as e:  # noqa: BLE001 - every seed of the program failed with it; the record says why
    code, error = 1, f"{type(e).__name__}: {e}"
  for job in jobs:
    on_done(Outcome(job.seed, job.name, code, time.monotonic() - started, error, job.point))


def sweep_record(args, train_argv: Sequence[str], outcomes: Sequence[Outcome]) -> Dict:
  return {"agent": args.agent, "env": args.env, "seeds": args.seed_list, "grid": args.grid, "train_args": list(train_argv),
          "parallel": args.parallel, "one_core_each": args.one_core_each,
          "runs": [{"seed": o.seed, "run_dir": o.name, "status": "ok" if o.returncode == 0 else "failed",
                    "returncode": o.returncode, "wall_seconds": round(o.seconds, 2), "error": o.error,
                    **({"point": o.point} if o.point else {})}
                   for o in sorted(outcomes, key=lambda o: (o.name, o.seed))]}


def main(argv: Optional[Sequence[str]] = None) -> int:
  args, train_argv = parse_args(list(sys.argv[1:] if argv is None else argv))
  from jrl.experiment import sweep_report
  from jrl.experiment.files import write_json
  os.makedirs(args.run_dir, exist_ok=True)
  jobs = plan(args.agent, args.env, [r for r in args.runs if r not in args.reused], args.run_dir, train_argv)
  at_once = "all in one vmapped program" if args.vmapped else \
      f"{args.parallel} at a time{', a core each' if args.one_core_each else ''}"
  points = f" x {len(args.points)} grid points" if args.points != [None] else ""
  print(f"[sweep] {args.agent} on {args.env}: {len(args.seed_list)} seeds ({args.seeds}){points}, {at_once}, "
        f"into {args.run_dir}", flush=True)
  record_path = os.path.join(args.run_dir, sweep_report.SWEEP_FILE)
  outcomes: List[Outcome] = []
  for seed, point in args.reused:
    outcomes.append(Outcome(seed, sweep_report.run_dir_name(args.agent, args.env, seed, point), 0, 0.0, "", point))
    print(f"[sweep] seed {seed}{' ' + sweep_report.point_label(point) if point else ''}: finished earlier with the "
          "same settings; reused", flush=True)
  if args.reused:
    write_json(record_path, sweep_record(args, train_argv, outcomes))

  def on_done(outcome: Outcome) -> None:
    outcomes.append(outcome)
    write_json(record_path, sweep_record(args, train_argv, outcomes))
    state = "done" if outcome.returncode == 0 else \
        f"FAILED ({outcome.error}; log {os.path.join(args.run_dir, 'logs', outcome.name + '.log')})"
    print(f"[sweep] seed {outcome.seed}{' ' + sweep_report.point_label(outcome.point) if outcome.point else ''}: "
          f"{state} in {outcome.seconds:.1f}s "
          f"[{len(outcomes)}/{len(args.runs)} finished]", flush=True)

  try:
    if args.vmapped:
      run_vmapped(args, jobs, on_done)
    else:
      run_jobs(jobs, args.parallel, os.path.join(args.run_dir, "logs"), on_done, args.one_core_each)
  except KeyboardInterrupt as e:  # a vmapped program's runs have checkpointed (RunInterrupted)
    from jrl.experiment.interrupt import exit_status
    signum = getattr(e, "signum", None)
    kept = (f"every unfinished run checkpointed at {e.env_steps} env steps; the same command continues them; "
            if getattr(e, "checkpoint", None) else "")
    print(f"{PROG}: interrupted{f' ({signal.Signals(signum).name})' if signum else ''}; {kept}finished seeds are "
          f"in {record_path}; python -m launch.report {args.run_dir} reports on them", file=sys.stderr)
    return exit_status(signum or signal.SIGINT)
  failed = [o for o in outcomes if o.returncode != 0]
  runs = sweep_report.load_runs([args.run_dir])
  report = sweep_report.write_report(args.run_dir, runs, reps=args.reps, seed=args.bootstrap_seed)
  for group in report["groups"]:
    if "iqm" in group:
      iqm, mean = group["iqm"], group["mean"]
      print(f"[sweep] {group['agent']} on {group['env']}: {len(group['scores'])} runs, final eval IQM "
            f"{iqm['point']:.1f} [{iqm['low']:.1f}, {iqm['high']:.1f}], mean {mean['point']:.1f} "
            f"[{mean['low']:.1f}, {mean['high']:.1f}] (95% CI)", flush=True)
  print(f"[sweep] {len(outcomes) - len(failed)}/{len(outcomes)} seeds finished"
        + (f", failed: {', '.join(str(o.seed) for o in sorted(failed))}" if failed else "")
        + f" | report {os.path.join(args.run_dir, sweep_report.REPORT_MD)}", flush=True)
  global _finished_sweep
  _finished_sweep = True  # its record, report and runs are written
  return 1 if failed else 0


if __name__ == "__main__":
  end_process(main(), _finished_sweep)
