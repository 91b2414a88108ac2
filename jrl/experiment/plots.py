"""PNG plots of a run directory's metrics.

matplotlib's object-oriented API on an Agg canvas: importing or plotting never switches the
process's pyplot backend (a notebook or the caller's own figures are left as they are)."""

import csv
import os
import textwrap
import threading
from typing import Dict, List, Optional


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


def plot_learning_curve(run_dir: str, title: str, reward_threshold: Optional[float]) -> str:
  """eval return (and training episode return) against env steps -> plots/learning_curve.png."""
  fig = learning_curve_figure(run_dir, title, reward_threshold)
  os.makedirs(os.path.join(run_dir, "plots"), exist_ok=True)
  path = os.path.join(run_dir, "plots", "learning_curve.png")
  fig.savefig(path, dpi=100)
  return path


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
