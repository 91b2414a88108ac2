"""Seconds from a device command's last line to its process's exit: the commands as typed, which
skip the interpreter's teardown once everything is written (`launch.cli.end_process`), beside
the same commands ending the usual way (`sys.exit(main(argv))`), side by side in one run.

  .venv/bin/python bench/command_exit.py [--repeat 3] [--steps 4096] [--seeds 4]

Arms, each a process of its own, alternated `--repeat` times: `launch.train --backend device`
(PPO on gymnax:CartPole-v1), `launch.sweep --backend device --seeds 0-(N-1)` and
`launch.evaluate` of a device run (its best policy's evaluation again, on device), each as typed
(`python -m launch.train ...`) and through `python -c` calling its `main` and then `sys.exit`
(the interpreter tears down its modules: garbage collection over a run's heap). Prints each
arm's median seconds from its last output line to its exit, and the process's wall.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed(command) -> dict:
  """The command's seconds from start to exit and from its last output line to exit."""
  start = time.monotonic()
  proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  last, lines = start, []
  for line in proc.stdout:
    last = time.monotonic()
    lines.append(line)
  proc.wait()
  end = time.monotonic()
  if proc.returncode != 0:
    raise SystemExit(f"{' '.join(command)} failed ({proc.returncode}):\n{''.join(lines[-20:])}")
  return {"last_line_to_exit": end - last, "wall": end - start}


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--repeat", type=int, default=3)
  parser.add_argument("--steps", type=int, default=4096)
  parser.add_argument("--seeds", type=int, default=4)
  args = parser.parse_args()
  folder = tempfile.mkdtemp(prefix="command-exit-")
  flags = ["--agent", "ppo", "--env", "gymnax:CartPole-v1", "--backend", "device", "--steps", str(args.steps)]
  evaluated = os.path.join(folder, "evaluated")  # the run launch.evaluate plays again
  timed([sys.executable, "-m", "launch.train", *flags, "--run_dir", evaluated])
  commands = {"launch.train": lambda run_dir: flags + ["--run_dir", run_dir],
              "launch.sweep": lambda run_dir: flags + ["--seeds", f"0-{args.seeds - 1}", "--run_dir", run_dir],
              "launch.evaluate": lambda run_dir: [evaluated]}
  samples = {(name, typed): [] for name in commands for typed in (True, False)}
  for repeat in range(args.repeat):
    for name, argv in commands.items():
      for typed in (True, False):
        argv_here = argv(os.path.join(folder, f"{name}-{typed}-{repeat}"))
        command = ([sys.executable, "-u", "-m", name, *argv_here] if typed else
                   [sys.executable, "-u", "-c", f"import sys; from {name} import main; sys.exit(main({argv_here!r}))"])
        samples[(name, typed)].append(timed(command))
  print("| command | last line to exit s, as typed | the usual exit | ratio | wall s, as typed | the usual exit |")
  print("|---|---:|---:|---:|---:|---:|")
  median = lambda runs, key: statistics.median(r[key] for r in runs)
  for name in commands:
    typed, usual = samples[(name, True)], samples[(name, False)]
    a, b = median(typed, "last_line_to_exit"), median(usual, "last_line_to_exit")
    print(f"| {name} | {a:.2f} | {b:.2f} | {a / b:.2f} | {median(typed, 'wall'):.1f} | {median(usual, 'wall'):.1f} |")
  return 0


if __name__ == "__main__":
  sys.exit(main())
