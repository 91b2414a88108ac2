"""Start-up and exit times of an embedded run, as a user sees them.

Runs `python -m launch.train ... --steps 2000` (what `make train STEPS=2000` runs) as a
subprocess and prints, from this process's clock and the run's summary.json:

  to first step   command start -> the runner's first env step (`first_step_unix`)
  after last step the last env step -> process exit (final evaluation, checkpoint, plot,
                  report, interpreter exit), split at the `done:` line

  .venv/bin/python bench/startup_exit.py [--repeat 3] [--deterministic] [--stop_at_threshold] [-- extra flags]

Targets (issue 14): <= 3 s to the first step, <= 1 s after the last.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_once(args, extra, run_dir: str):
  cmd = [sys.executable, "-u", "-m", "launch.train", "--agent", args.agent, "--env", args.env, "--seed", "0",
         "--steps", str(args.steps), "--run_dir", run_dir, "--progress_seconds", "1"]
  if args.deterministic:
    cmd.append("--deterministic")
  if args.stop_at_threshold:
    # A threshold the first evaluation reaches: the run stops early, as a solved run does.
    cmd += ["--stop_at_threshold", "--reward_threshold", "5", "--eval_every", str(args.steps // 2)]
  cmd += extra
  started = time.time()
  proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  done_at, lines = None, []
  for line in proc.stdout:
    lines.append(line)
    if "] done:" in line:
      done_at = time.time()
  proc.wait()
  exited = time.time()
  if proc.returncode != 0 or done_at is None:
    raise SystemExit(f"run failed (exit {proc.returncode}):\n{''.join(lines[-20:])}")
  with open(os.path.join(run_dir, "summary.json")) as f:
    summary = json.load(f)
  return {
      "to_first_step": summary["details"]["first_step_unix"] - started,
      "last_step_to_done": done_at - summary["details"]["last_step_unix"],
      "done_to_exit": exited - done_at,
      "after_last_step": exited - summary["details"]["last_step_unix"],
      "total": exited - started,
      "bottleneck": summary.get("bottleneck"),
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--agent", default="dqn")
  parser.add_argument("--env", default="CartPole-v1")
  parser.add_argument("--steps", type=int, default=2000)
  parser.add_argument("--repeat", type=int, default=1)
  parser.add_argument("--deterministic", action="store_true", help="seeded buffer instead of Reverb")
  parser.add_argument("--stop_at_threshold", action="store_true", help="stop early at the first evaluation")
  args, extra = parser.parse_known_args()
  extra = [x for x in extra if x != "--"]
  results = []
  with tempfile.TemporaryDirectory(prefix="startup-exit-") as tmp:
    for i in range(args.repeat):
      r = run_once(args, extra, os.path.join(tmp, f"run{i}"))
      results.append(r)
      print(f"run {i}: to first step {r['to_first_step']:.2f} s | last step -> done line "
            f"{r['last_step_to_done']:.2f} s | done -> exit {r['done_to_exit']:.2f} s | after last step "
            f"{r['after_last_step']:.2f} s | total {r['total']:.1f} s | bottleneck {r['bottleneck']}", flush=True)
  kind = ("seeded buffer" if args.deterministic else "Reverb") + (", stop at threshold" if args.stop_at_threshold
                                                                   else "")
  med = lambda key: statistics.median(r[key] for r in results)
  print(f"{args.agent} {args.env} {args.steps} steps ({kind}), median of {len(results)}: "
        f"to first step {med('to_first_step'):.2f} s (target <= 3) | after last step "
        f"{med('after_last_step'):.2f} s (target <= 1), of which done -> exit {med('done_to_exit'):.2f} s")


if __name__ == "__main__":
  main()
