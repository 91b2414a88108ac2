"""PNG plots of a run directory's metrics.

matplotlib's object-oriented API on an Agg canvas: importing or plotting never switches the
process's pyplot backend (a notebook or the caller's own figures are left as they are)."""

import csv
import json
import os
import subprocess
import sys
import textwrap
import threading
from typing import Dict, List, NamedTuple, Optional, Sequence


def new_figure(**kwargs):
  """A matplotlib Figure drawn on its own Agg canvas (no pyplot), imported on first use
  (~0.4 s: not at start-up)."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure
  fig = Figure(**kwargs)
  FigureCanvasAgg(fig)
  return fig


def preload_in_background() -> None:
  """Imports matplotlib on a daemon thread, so that the plot at the end of a run does not
  wait for it. Best started while the caller compiles (XLA releases the GIL)."""
  def load():
    try:
      new_figure()
    except Exception:  # noqa: BLE001 - a warm-up only; the plot imports it again and reports errors
      pass
  threading.Thread(target=load, name="preload-matplotlib", daemon=True).start()


def read_csv(path: str) -> Dict[str, List[float]]:
  columns: Dict[str, List[float]] = {}
  if not os.path.exists(path):
    return columns
  with open(path) as f:
    for row in csv.DictReader(f):
      for key, value in row.items():
        try:
          columns.setdefault(key, []).append(float(value))
        except (TypeError, ValueError):  # text columns (e.g. a host name) are not plotted
          pass
  return columns


class Curve(NamedTuple):
  """One run's learning curve to draw (`plot_learning_curve`'s arguments)."""
  run_dir: str
  title: str
  reward_threshold: Optional[float]


def plot_learning_curve(run_dir: str, title: str, reward_threshold: Optional[float]) -> str:
  """eval return (and training episode return) against env steps -> plots/learning_curve.png."""
  return _draw_curve(Curve(run_dir, title, reward_threshold))


# A process of its own costs about as much to start (Python, then matplotlib's import) as drawing
# this many learning curves (bench/learning_curves.py measures both ways).
CURVES_PER_WORKER = 8


def plot_workers(curves: int, cores: int) -> int:
  """How many processes draw `curves` learning curves on a machine with `cores` cores: 0 (this
  process draws them, one after another) unless at least two processes would each have
  CURVES_PER_WORKER curves to draw; at most one a core (this process only waits for them)."""
  workers = min(cores, curves // CURVES_PER_WORKER)
  return workers if workers >= 2 else 0


def available_cores() -> int:
  """The cores this process may run on (its affinity: a Slurm step's or taskset's share)."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not on Linux
    return os.cpu_count() or 1


def _curve_path(run_dir: str) -> str:
  return os.path.join(run_dir, "plots", "learning_curve.png")


def _draw_curve(curve: Curve) -> str:
  fig = learning_curve_figure(curve.run_dir, curve.title, curve.reward_threshold)
  path = _curve_path(curve.run_dir)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fig.savefig(path, dpi=100)
  return path


def plot_learning_curves(curves: Sequence[Curve], workers: Optional[int] = None) -> List[str]:
  """Draws many runs' learning curves (the runs of a vmapped sweep end together); returns their
  paths. Drawing is matplotlib's Python work and holds the GIL, so a large sweep's curves are drawn
  by `workers` processes of their own (default `plot_workers` on this machine's cores), each a
  share of them. They are fresh interpreters (`python -m jrl.experiment.plots`, the curves on
  stdin), not multiprocessing's: a fork would copy this process's JAX runtime, and a spawn
  imports the caller's main script again. The PNGs are the same bytes either way."""
  if workers is None:
    workers = plot_workers(len(curves), available_cores())
  if workers < 1 or len(curves) < 2:
    return [_draw_curve(curve) for curve in curves]
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))  # this process's imports
  procs = []
  for share in (curves[k::workers] for k in range(workers)):
    proc = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE, env=env, text=True)
    procs.append(proc)
    try:
      with proc.stdin:
        json.dump([list(curve) for curve in share], proc.stdin)
    except BrokenPipeError:  # it ended before reading its share: its exit status says so below
      pass
  failed = [proc.wait() for proc in procs]
  if any(failed):
    raise RuntimeError(f"a process drawing learning curves failed (exit statuses {failed}; its error is above)")
  return [_curve_path(curve.run_dir) for curve in curves]


def learning_curve_figure(run_dir: str, title: str, reward_threshold: Optional[float]):
  """The learning curve's Figure, laid out."""
  evaluation = read_csv(os.path.join(run_dir, "metrics", "evaluator.csv"))
  actor = read_csv(os.path.join(run_dir, "metrics", "actor.csv"))
  fig = new_figure(figsize=(7, 4.5))
  ax = fig.subplots()
  if actor.get("episode_return"):
    ax.plot(actor["actor_steps"], actor["episode_return"], color="tab:gray", alpha=0.6,
            label="training episodes (mean per row)")
  if evaluation.get("eval_return"):
    ax.plot(evaluation["actor_steps"], evaluation["eval_return"], "o-", color="tab:blue",
            label="evaluation (mean)")
  if reward_threshold is not None:
    ax.axhline(reward_threshold, color="tab:green", linestyle="--", label=f"threshold {reward_threshold:g}")
  ax.set_xlabel("env steps")
  ax.set_ylabel("return")
  lines = textwrap.wrap(title, TITLE_CHARACTERS) or [""]
  ax.set_title("\n".join(lines))
  ax.grid(alpha=0.3)
  ax.legend(loc="best")
  # Fixed margins, not tight_layout: measuring the layout draws the figure once more, about a
  # third of a plot's time, which a sweep pays once per run at its end.
  # The left margin makes room for the widest y tick label: the limits' integer digits and sign,
  # and a fraction's where the range is small.
  low, high = ax.get_ylim()
  tick_characters = min(max(len(f"{abs(v):.0f}") + (v < 0) for v in (low, high)) + 2 * (high - low < 10), 10)
  fig.subplots_adjust(left=0.05 + 0.013 * tick_characters, right=0.98, bottom=0.11,
                      top=0.93 - 0.05 * (len(lines) - 1))
  return fig


# Title characters on a line of the 7-inch learning curve at matplotlib's default title size.
TITLE_CHARACTERS = 66


if __name__ == "__main__":  # a worker of plot_learning_curves: its share of the curves on stdin
  for fields in json.load(sys.stdin):
    _draw_curve(Curve(*fields))
