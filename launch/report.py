"""Rebuild a multi-seed report from existing runs.

  python -m launch.report DIR [DIR ...] [--out OUT] [--reps N] [--bootstrap_seed S]

Each DIR is a run directory or a folder of them (a launch.sweep folder, whose sweep.json also
names the seeds that failed). Runs are grouped by (agent, env) from their config.json, so sweeps
of several agents or envs compare in one report: OUT/report.md, report.json and PNGs (see
jrl.experiment.sweep_report). OUT defaults to DIR when a single folder of runs is given.
"""

import argparse
import os
import sys
from typing import Optional, Sequence

from launch.cli import OneLineParser, fail

PROG = "python -m launch.report"


def main(argv: Optional[Sequence[str]] = None) -> int:
  from jrl.errors import ConfigError
  from jrl.experiment import sweep_report
  parser = OneLineParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("run_dirs", nargs="+", metavar="DIR", help="run directories or sweep folders")
  parser.add_argument("--out", default="", help="report folder (default: DIR, when one folder of runs is given)")
  parser.add_argument("--reps", type=int, default=sweep_report.DEFAULT_REPS,
                      help=f"bootstrap resamples of the IQM/mean CIs (default {sweep_report.DEFAULT_REPS})")
  parser.add_argument("--bootstrap_seed", type=int, default=0, help="seed of the bootstrap (default 0)")
  args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
  try:
    if args.reps < 1:
      raise ConfigError("reps", f"must be >= 1, got {args.reps}")
    out = args.out
    if not out:
      single = args.run_dirs[0]
      if len(args.run_dirs) > 1 or os.path.isfile(os.path.join(single, "config.json")):
        raise ConfigError("out", "give --out FOLDER when reporting on several folders or on a single run")
      out = single
    if os.path.exists(out) and not os.path.isdir(out):
      raise ConfigError("out", f"'{out}' is an existing file, not a folder")
    if os.path.isfile(os.path.join(out, "config.json")):
      raise ConfigError("out", f"'{out}' is a run directory; its report.md is the run's own")
    runs = sweep_report.load_runs(args.run_dirs)
  except ConfigError as e:
    fail(PROG, e)
  report = sweep_report.write_report(out, runs, reps=args.reps, seed=args.bootstrap_seed)
  for group in report["groups"]:
    done = f"{len(group['scores'])} runs" + (f" ({len(group['failed'])} failed)" if group["failed"] else "")
    if "iqm" in group:
      iqm, mean = group["iqm"], group["mean"]
      print(f"{group['agent']} on {group['env']}: {done}, final eval IQM {iqm['point']:.1f} "
            f"[{iqm['low']:.1f}, {iqm['high']:.1f}], mean {mean['point']:.1f} [{mean['low']:.1f}, {mean['high']:.1f}]")
    else:
      print(f"{group['agent']} on {group['env']}: {done}, no finished run")
  print(f"report: {len(runs)} runs in {len(report['groups'])} groups | {os.path.join(out, sweep_report.REPORT_MD)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
