"""Reports over many runs: score matrices, rliable aggregates with stratified bootstrap CIs,
learning curves, steps to threshold and performance profiles, as markdown and PNGs.

What is aggregated: a run's *score* is its final evaluation return, the mean return of its last
evaluation (greedy unless the agent's greedy_eval is false; the last row of `metrics/evaluator.csv`,
`summary.json`'s `eval_return`).
Within one env the scores are raw returns. Across envs, each score is divided by its env's
reward threshold (1.0 = solved), for envs whose threshold is positive.

Runs are grouped by (agent, env) from their `config.json`. Each group's score matrix is
`[num_runs, 1]` (runs sorted by seed; rliable's `[runs, tasks]` layout), and its IQM and mean
come with 95% percentile CIs of rliable's stratified bootstrap, computed on that matrix alone
with the same bootstrap seed, so a group's numbers do not depend on what else is in the report.

Pure pieces (`parse_seeds`, `group_runs`, `score_matrix`, `interval_estimate`, `build_report`,
`render_markdown`, the `*_figure` functions) take and return values; `load_run`, `load_runs`
and `write_report` do the file I/O. Figures use matplotlib's object-oriented API on an Agg
canvas (no pyplot, no backend switch): importing this module has no side effects.
"""

import csv
import json
import math
import os
import re
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from jrl.errors import ConfigError
from jrl.experiment import bootstrap
from jrl.experiment.files import path_safe

SWEEP_FILE = "sweep.json"      # written by launch.sweep: the seeds, their run dirs and outcomes
REPORT_MD = "report.md"
REPORT_JSON = "report.json"
FIGURES = {"curves": "curves.png", "aggregates": "aggregates.png",
           "steps_to_threshold": "steps_to_threshold.png", "profile": "performance_profile.png"}
DEFAULT_REPS = 50_000          # bootstrap resamples of the IQM / mean CIs (rliable's default)
CURVE_REPS = 2_000             # resamples of the curves' and profiles' bands (rliable's default for profiles)
CI_SIZE = 0.95

Group = Tuple[str, str]        # (agent, env)


class Run(NamedTuple):
  """One run directory as the report sees it."""
  run_dir: str
  agent: str
  env: str
  seed: int
  complete: bool                      # summary.json was written: the run finished
  final_return: Optional[float]       # score: mean return of the last evaluation
  best_return: Optional[float]
  threshold: Optional[float]          # the env's reward threshold (None: none known)
  steps_to_threshold: Optional[int]   # env steps of the first evaluation >= threshold
  env_steps: Optional[int]            # env steps the run took
  wall_seconds: Optional[float]
  curve_steps: np.ndarray             # [E] env steps of each evaluation
  curve_returns: np.ndarray           # [E] mean greedy return of each evaluation
  error: str = ""                     # why an incomplete run has no result


# ----------------------------------------------------------------------------- pure pieces

def parse_seeds(text: str) -> List[int]:
  """'0-4' -> [0, 1, 2, 3, 4]; '0,2,5' -> [0, 2, 5]; '3' -> [3]; ranges and lists mix
  ('0-2,7'). ConfigError naming `seeds` for an empty, reversed, negative, repeated or garbled one."""
  text = (text or "").strip()
  if not text:
    raise ConfigError("seeds", "is empty; give e.g. --seeds 0-4, 0,2,5 or 3")
  seeds: List[int] = []
  for part in text.split(","):
    part = part.strip()
    match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
    if not match:
      raise ConfigError("seeds", f"'{text}' is not a seed list; give e.g. --seeds 0-4, 0,2,5 or 3")
    first = int(match.group(1))
    last = int(match.group(2)) if match.group(2) is not None else first
    if last < first:
      raise ConfigError("seeds", f"range '{part}' is empty (it ends before it starts); did you mean --seeds {last}-{first}?")
    seeds.extend(range(first, last + 1))
  repeated = sorted({s for s in seeds if seeds.count(s) > 1})
  if repeated:
    raise ConfigError("seeds", f"'{text}' repeats seed(s) {','.join(map(str, repeated))}")
  return seeds


def run_dir_name(agent: str, env: str, seed: int, point: Optional[Dict[str, float]] = None) -> str:
  """A sweep's folder for one seed (and grid point): `<agent>-<env>-s<seed>`, or
  `<agent>-<env>-<field>=<value>...-s<seed>`, made path-safe (`files.path_safe`)."""
  return path_safe(f"{agent}-{env}-{point_label(point, '-')}-s{seed}" if point else f"{agent}-{env}-s{seed}")


def point_label(point: Optional[Dict[str, float]], sep: str = " ") -> str:
  """A grid point as text: `learning_rate=0.001 discount=0.99`."""
  return sep.join(f"{k}={v:g}" for k, v in (point or {}).items())


def group_runs(runs: Sequence[Run]) -> Dict[Group, List[Run]]:
  """Runs by (agent, env), groups in order of first appearance, runs sorted by seed."""
  groups: Dict[Group, List[Run]] = {}
  for run in runs:
    groups.setdefault((run.agent, run.env), []).append(run)
  return {key: sorted(members, key=lambda r: (r.seed, r.run_dir)) for key, members in groups.items()}


def score_matrix(runs: Sequence[Run]) -> np.ndarray:
  """[num_complete_runs, 1] final eval returns of the complete runs, by seed (rliable's layout)."""
  scores = [r.final_return for r in sorted(runs, key=lambda r: (r.seed, r.run_dir))
            if r.complete and r.final_return is not None]
  return np.asarray(scores, dtype=np.float64).reshape(-1, 1)


def interval_estimate(scores: np.ndarray, metric: bootstrap.Metric, reps: int = DEFAULT_REPS,
                      seed: int = 0) -> Tuple[float, float, float]:
  """(point, low, high): `metric` (a `bootstrap` metric of one parameter) of `scores` [runs,
  tasks] and its 95% stratified bootstrap CI (rliable's get_interval_estimates, percentile method,
  bootstrap seed `seed`, to the bit; `jrl.experiment.bootstrap`)."""
  point, low, high = bootstrap.interval(scores, metric, reps, seed, CI_SIZE)
  return float(point[0]), float(low[0]), float(high[0])


def aggregates(scores: np.ndarray, reps: int = DEFAULT_REPS, seed: int = 0) -> Dict[str, Tuple[float, float, float]]:
  """{'iqm': (point, low, high), 'mean': (...)} of a score matrix [runs, tasks] (a single run's
  CI is its own score)."""
  return {"iqm": interval_estimate(scores, bootstrap.iqm, reps, seed),
          "mean": interval_estimate(scores, bootstrap.mean, reps, seed)}


def common_curve(runs: Sequence[Run]) -> Tuple[np.ndarray, np.ndarray]:
  """(steps [T], returns [N, T]): the evaluations every complete run has, at the same env steps."""
  complete = [r for r in runs if r.complete and len(r.curve_steps)]
  if not complete:
    return np.zeros(0, np.int64), np.zeros((0, 0))
  steps = complete[0].curve_steps
  for run in complete[1:]:
    steps = np.intersect1d(steps, run.curve_steps)
  returns = [[r.curve_returns[np.searchsorted(r.curve_steps, s)] for s in steps] for r in complete]
  return steps.astype(np.int64), np.asarray(returns, dtype=np.float64).reshape(len(complete), len(steps))


def aggregate_curve(runs: Sequence[Run], reps: int = CURVE_REPS, seed: int = 0) -> Dict[str, List[float]]:
  """IQM over runs of the eval return at each common evaluation, with its 95% bootstrap band."""
  steps, returns = common_curve(runs)
  if not len(steps):
    return {"steps": [], "iqm": [], "low": [], "high": []}
  points, low, high = bootstrap.interval(returns[:, None, :], bootstrap.iqm_per_step, reps, seed, CI_SIZE)
  return {"steps": steps.tolist(), "iqm": points.tolist(), "low": low.tolist(), "high": high.tolist()}


def performance_profile(scores: np.ndarray, taus: np.ndarray, reps: int = CURVE_REPS,
                        seed: int = 0) -> Dict[str, List[float]]:
  """Fraction of runs whose score exceeds each tau, with its 95% bootstrap band
  (rliable's create_performance_profile, score distributions)."""
  fraction, low, high = bootstrap.interval(scores, bootstrap.fraction_above(taus), reps, seed, CI_SIZE)
  return {"taus": np.asarray(taus).tolist(), "fraction": fraction.tolist(), "low": low.tolist(),
          "high": high.tolist()}


def steps_to_threshold_stats(runs: Sequence[Run]) -> Dict[str, Any]:
  """Steps to threshold over the complete runs: each run's (None: not reached within its budget),
  how many reached it, and the median / min / max over those that did."""
  complete = [r for r in runs if r.complete]
  steps = [r.steps_to_threshold for r in complete]
  reached = sorted(s for s in steps if s is not None)
  return {"steps": steps, "reached": len(reached), "runs": len(complete),
          "threshold": next((r.threshold for r in complete if r.threshold is not None), None),
          "median": float(np.median(reached)) if reached else None,
          "min": reached[0] if reached else None, "max": reached[-1] if reached else None}


def normalised_matrix(groups: Dict[Group, List[Run]], agent: str) -> Tuple[np.ndarray, List[str]]:
  """[N, tasks] scores / threshold of one agent over its envs with a positive threshold; N is the
  fewest complete runs of any of those envs (each env's first N by seed)."""
  columns, envs = [], []
  for (a, env), runs in groups.items():
    threshold = next((r.threshold for r in runs if r.threshold is not None), None)
    if a != agent or threshold is None or threshold <= 0:
      continue
    scores = score_matrix(runs)[:, 0]
    if len(scores):
      columns.append(scores / threshold)
      envs.append(env)
  if not columns:
    return np.zeros((0, 0)), []
  n = min(len(c) for c in columns)
  return np.stack([c[:n] for c in columns], axis=1), envs


def build_report(runs: Sequence[Run], reps: int = DEFAULT_REPS, seed: int = 0,
                 curve_reps: int = CURVE_REPS, base: str = "") -> Dict[str, Any]:
  """Everything the report shows, as JSON-able values (report.json); run directories inside
  `base` are named relative to it."""
  groups = group_runs(runs)
  out: Dict[str, Any] = {"bootstrap": {"method": "percentile stratified bootstrap (rliable)", "reps": reps,
                                       "curve_and_profile_reps": curve_reps, "seed": seed,
                                       "confidence": CI_SIZE},
                         "score": "final evaluation return (mean return of the last evaluation, greedy unless "
                                  "greedy_eval is false)",
                         "groups": [], "across_envs": []}
  for (agent, env), members in groups.items():
    matrix = score_matrix(members)
    entry: Dict[str, Any] = {
        "agent": agent, "env": env,
        "seeds": [r.seed for r in members if r.complete],
        "scores": matrix[:, 0].tolist(),
        "runs": [_run_row(r, base) for r in members],
        "failed": [{"seed": r.seed, "run_dir": _shown(r.run_dir, base), "error": r.error}
                   for r in members if not r.complete],
        "steps_to_threshold": steps_to_threshold_stats(members),
        "curve": aggregate_curve(members, curve_reps, seed),
    }
    if len(matrix):
      entry.update({name: dict(zip(("point", "low", "high"), value))
                    for name, value in aggregates(matrix, reps, seed).items()})
      entry["profile"] = performance_profile(matrix, _taus(matrix), curve_reps, seed)
    out["groups"].append(entry)
  envs = {env for _, env in groups}
  if len(envs) > 1:
    for agent in dict.fromkeys(a for a, _ in groups):
      matrix, agent_envs = normalised_matrix(groups, agent)
      if matrix.size == 0:
        continue
      entry = {"agent": agent, "envs": agent_envs, "runs_per_env": int(matrix.shape[0]),
               "scores": matrix.tolist()}
      entry.update({name: dict(zip(("point", "low", "high"), value))
                    for name, value in aggregates(matrix, reps, seed).items()})
      entry["profile"] = performance_profile(matrix, np.linspace(0.0, max(1.2, float(matrix.max()) * 1.05), 61),
                                             curve_reps, seed)
      out["across_envs"].append(entry)
  return out


def _taus(matrix: np.ndarray) -> np.ndarray:
  low, high = float(matrix.min()), float(matrix.max())
  pad = max(1.0, 0.05 * (high - low))
  return np.linspace(min(0.0, low - pad), high + pad, 61)


def _shown(path: str, base: str) -> str:
  if base:
    relative = os.path.relpath(os.path.abspath(path), os.path.abspath(base))
    if not relative.startswith(".."):
      return relative
  return path


def _run_row(run: Run, base: str = "") -> Dict[str, Any]:
  return {"seed": run.seed, "run_dir": _shown(run.run_dir, base), "complete": run.complete, "final_return": run.final_return,
          "best_return": run.best_return, "steps_to_threshold": run.steps_to_threshold,
          "env_steps": run.env_steps, "wall_seconds": run.wall_seconds, "error": run.error}


def _cell(text: str) -> str:
  """Text safe inside a markdown table cell."""
  return str(text).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;").replace("\n", " ")


def _fmt(value: Optional[float], digits: int = 1) -> str:
  if value is None or (isinstance(value, float) and math.isnan(value)):
    return "-"
  return f"{value:.{digits}f}"


def _estimate(entry: Dict[str, Any], name: str, digits: int = 1) -> str:
  if name not in entry:
    return "-"
  e = entry[name]
  return f"{_fmt(e['point'], digits)} [{_fmt(e['low'], digits)}, {_fmt(e['high'], digits)}]"


def render_markdown(report: Dict[str, Any]) -> str:
  """report.md from `build_report`'s values."""
  b = report["bootstrap"]
  lines = [
      "# Sweep report", "",
      "**Score**: a run's final evaluation return, the mean return of its last evaluation (greedy unless "
      "the agent's greedy_eval is false; last row of `metrics/evaluator.csv`, `eval_return` in `summary.json`). "
      "Within an env the scores are raw returns; across envs each is divided by the env's reward threshold "
      "(1.0 = solved).",
      "",
      f"**Aggregates**: IQM (mean of the middle 50% of runs) and mean over the runs of each (agent, env), "
      f"with {b['confidence']:.0%} confidence intervals from rliable's stratified bootstrap "
      f"(percentile method, {b['reps']} resamples, bootstrap seed {b['seed']}; each group's matrix "
      f"bootstrapped alone). Failed runs are listed and left out of every aggregate.",
      "",
  ]
  if any(0 < len(g["scores"]) < 4 for g in report["groups"]):
    lines += ["With fewer than 4 runs the IQM trims nothing (scipy's trim_mean cuts floor(n/4) runs each "
              "side) and equals the mean.", ""]
  lines += ["## Aggregates", "",
            "| agent | env | runs | IQM [95% CI] | mean [95% CI] | reached threshold | median steps to threshold |",
            "|---|---|---|---|---|---|---|"]
  for g in report["groups"]:
    s = g["steps_to_threshold"]
    threshold = f" (>= {s['threshold']:g})" if s["threshold"] is not None else ""
    failed = f" ({len(g['failed'])} failed)" if g["failed"] else ""
    lines.append(f"| {g['agent']} | {g['env']} | {len(g['scores'])}{failed} | {_estimate(g, 'iqm')} | "
                 f"{_estimate(g, 'mean')} | {s['reached']}/{s['runs']}{threshold} | {_fmt(s['median'], 0)} |")
  if report["across_envs"]:
    lines += ["", "## Across envs (score / reward threshold)", "",
              "| agent | envs | runs per env | IQM [95% CI] | mean [95% CI] |", "|---|---|---|---|---|"]
    for a in report["across_envs"]:
      lines.append(f"| {a['agent']} | {', '.join(a['envs'])} | {a['runs_per_env']} | {_estimate(a, 'iqm', 3)} | "
                   f"{_estimate(a, 'mean', 3)} |")
  lines += ["", "## Runs", "",
            "| agent | env | seed | status | final eval | best eval | steps to threshold | env steps | wall s | run dir |",
            "|---|---|---|---|---|---|---|---|---|---|"]
  for g in report["groups"]:
    for r in g["runs"]:
      status = "ok" if r["complete"] else f"FAILED: {_cell(r['error'] or 'no summary.json')}"
      reach = r["steps_to_threshold"] if r["steps_to_threshold"] is not None else ("not reached" if r["complete"] else "-")
      lines.append(f"| {g['agent']} | {g['env']} | {r['seed']} | {status} | {_fmt(r['final_return'])} | "
                   f"{_fmt(r['best_return'])} | {reach} | {r['env_steps'] if r['env_steps'] is not None else '-'} | "
                   f"{_fmt(r['wall_seconds'])} | `{r['run_dir']}` |")
  lines += ["", "## Figures", "",
            f"- Learning curves: eval return against env steps, each seed (top) and the IQM over seeds with "
            f"its {b['confidence']:.0%} bootstrap band ({b['curve_and_profile_reps']} resamples) at the "
            f"evaluations every complete run has (bottom).",
            "", f"![learning curves]({FIGURES['curves']})", "",
            "- IQM and mean with their confidence intervals.", "", f"![aggregates]({FIGURES['aggregates']})", "",
            "- Steps to threshold: the fraction of runs that have reached the env's threshold by each env "
            "step (runs that never reach it keep the curve below 1).",
            "", f"![steps to threshold]({FIGURES['steps_to_threshold']})", "",
            "- Performance profile: the fraction of runs whose score exceeds tau, with its bootstrap band.",
            "", f"![performance profile]({FIGURES['profile']})", ""]
  return "\n".join(lines)


# ----------------------------------------------------------------------------- figures

def _new_figure(width: float, height: float):
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure
  fig = Figure(figsize=(width, height))
  FigureCanvasAgg(fig)
  return fig


def _colors(report: Dict[str, Any]) -> Dict[str, str]:
  agents = list(dict.fromkeys(g["agent"] for g in report["groups"]))
  palette = [f"C{i % 10}" for i in range(len(agents))]
  return dict(zip(agents, palette))


def _envs(report: Dict[str, Any]) -> List[str]:
  return list(dict.fromkeys(g["env"] for g in report["groups"]))


def curves_figure(report: Dict[str, Any], runs: Sequence[Run]):
  """Per-seed eval curves (top row) and the IQM over seeds with its band (bottom), one column per env."""
  envs, colors = _envs(report), _colors(report)
  fig = _new_figure(5.5 * len(envs), 7.5)
  axes = fig.subplots(2, len(envs), squeeze=False)
  for column, env in enumerate(envs):
    top, bottom = axes[0][column], axes[1][column]
    for run in runs:
      if run.env == env and len(run.curve_steps):
        top.plot(run.curve_steps, run.curve_returns, color=colors[run.agent], alpha=0.7, linewidth=1,
                 linestyle="-" if run.complete else ":", label=f"{run.agent} s{run.seed}")
    for g in report["groups"]:
      curve = g["curve"]
      if g["env"] == env and curve["steps"]:
        bottom.plot(curve["steps"], curve["iqm"], "o-", color=colors[g["agent"]], markersize=3,
                    label=f"{g['agent']} IQM ({len(g['scores'])} runs)")
        bottom.fill_between(curve["steps"], curve["low"], curve["high"], color=colors[g["agent"]], alpha=0.2)
    threshold = next((g["steps_to_threshold"]["threshold"] for g in report["groups"] if g["env"] == env), None)
    for ax, title in ((top, f"{env}: each seed"), (bottom, f"{env}: IQM over seeds, 95% CI")):
      if threshold is not None:
        ax.axhline(threshold, color="tab:green", linestyle="--", linewidth=1, label=f"threshold {threshold:g}")
      ax.set_title(title)
      ax.set_xlabel("env steps")
      ax.set_ylabel("eval return")
      ax.grid(alpha=0.3)
      if ax.has_data():
        ax.legend(loc="best", fontsize="small")
  fig.tight_layout()
  return fig


def aggregates_figure(report: Dict[str, Any]):
  """IQM and mean per group as points with CI bars; one column per env (plus one across envs)."""
  envs, colors = _envs(report), _colors(report)
  panels: List[Tuple[str, List[Dict[str, Any]]]] = [(env, [g for g in report["groups"] if g["env"] == env and "iqm" in g])
                                                    for env in envs]
  if report["across_envs"]:
    panels.append(("all envs (score / threshold)", report["across_envs"]))
  fig = _new_figure(5.0 * len(panels), 2.2 + 0.8 * max(1, max(len(p[1]) for p in panels)))
  axes = fig.subplots(1, len(panels), squeeze=False)[0]
  for ax, (title, entries) in zip(axes, panels):
    for row, entry in enumerate(entries):
      for offset, name, marker in ((0.12, "iqm", "o"), (-0.12, "mean", "s")):
        e = entry[name]
        ax.errorbar([e["point"]], [row + offset], xerr=[[e["point"] - e["low"]], [e["high"] - e["point"]]],
                    fmt=marker, color=colors.get(entry["agent"], "C0"), capsize=4,
                    label={"iqm": "IQM", "mean": "mean"}[name] if row == 0 else None,
                    alpha=1.0 if name == "iqm" else 0.6)
    ax.set_yticks(range(len(entries)))
    ax.set_yticklabels([e["agent"] for e in entries])
    ax.set_ylim(-0.6, len(entries) - 0.4)
    ax.set_xlabel("final eval return" if not title.startswith("all envs") else "final eval return / threshold")
    ax.set_title(title)
    ax.grid(alpha=0.3, axis="x")
    if entries:
      ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=2, fontsize="small", frameon=False)
  fig.tight_layout()
  return fig


def steps_to_threshold_figure(report: Dict[str, Any]):
  """Per env: fraction of each group's runs that reached the threshold by each env step."""
  envs, colors = _envs(report), _colors(report)
  fig = _new_figure(5.5 * len(envs), 4.0)
  axes = fig.subplots(1, len(envs), squeeze=False)[0]
  for ax, env in zip(axes, envs):
    budget = 1
    for g in report["groups"]:
      if g["env"] != env:
        continue
      s = g["steps_to_threshold"]
      budget = max([budget] + [r["env_steps"] or 0 for r in g["runs"]])
      reached = sorted(x for x in s["steps"] if x is not None)
      if s["runs"]:
        xs = [0] + reached + [budget]
        ys = [0.0] + [(i + 1) / s["runs"] for i in range(len(reached))] + [len(reached) / s["runs"]]
        ax.step(xs, ys, where="post", color=colors[g["agent"]],
                label=f"{g['agent']}: {s['reached']}/{s['runs']} reached")
        ax.plot(reached, [0.02] * len(reached), "|", color=colors[g["agent"]], markersize=12)
    threshold = next((g["steps_to_threshold"]["threshold"] for g in report["groups"] if g["env"] == env), None)
    ax.set_title(f"{env}: steps to threshold" + (f" {threshold:g}" if threshold is not None else " (none known)"))
    ax.set_xlabel("env steps")
    ax.set_ylabel("fraction of runs at threshold")
    ax.set_ylim(-0.02, 1.05)
    ax.grid(alpha=0.3)
    if ax.has_data():
      ax.legend(loc="best", fontsize="small")
  fig.tight_layout()
  return fig


def profile_figure(report: Dict[str, Any]):
  """Performance profiles: fraction of runs with score > tau, per env (plus across envs)."""
  envs, colors = _envs(report), _colors(report)
  panels = [(env, [g for g in report["groups"] if g["env"] == env and "profile" in g], "final eval return")
            for env in envs]
  if report["across_envs"]:
    panels.append(("all envs", report["across_envs"], "final eval return / threshold"))
  fig = _new_figure(5.5 * len(panels), 4.0)
  axes = fig.subplots(1, len(panels), squeeze=False)[0]
  for ax, (title, entries, xlabel) in zip(axes, panels):
    for entry in entries:
      p = entry["profile"]
      ax.plot(p["taus"], p["fraction"], color=colors.get(entry["agent"], "C0"), label=entry["agent"])
      ax.fill_between(p["taus"], p["low"], p["high"], color=colors.get(entry["agent"], "C0"), alpha=0.2)
    ax.set_title(f"{title}: performance profile")
    ax.set_xlabel(f"{xlabel} (tau)")
    ax.set_ylabel("fraction of runs with score > tau")
    ax.set_ylim(-0.02, 1.05)
    ax.grid(alpha=0.3)
    if entries:
      ax.legend(loc="best", fontsize="small")
  fig.tight_layout()
  return fig


# ----------------------------------------------------------------------------- I/O

def _read_json(path: str) -> Optional[Dict[str, Any]]:
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def _read_eval_curve(run_dir: str) -> Tuple[np.ndarray, np.ndarray]:
  path = os.path.join(run_dir, "metrics", "evaluator.csv")
  steps, returns = [], []
  if os.path.exists(path):
    with open(path, newline="") as f:
      for row in csv.DictReader(f):
        try:
          steps.append(int(float(row["actor_steps"])))
          returns.append(float(row["eval_return"]))
        except (KeyError, TypeError, ValueError):
          continue
  order = np.argsort(steps, kind="stable")
  return np.asarray(steps, np.int64)[order], np.asarray(returns, np.float64)[order]


def load_run(run_dir: str, error: str = "", point: Optional[Dict[str, float]] = None) -> Run:
  """A run directory (config.json; summary.json once finished; metrics/evaluator.csv). A run of a
  grid `point` is labelled `<agent> <point>`, so each grid point is a group of the report."""
  config = _read_json(os.path.join(run_dir, "config.json"))
  if config is None:
    raise ConfigError("run_dir", f"'{run_dir}' is not a run directory (no readable config.json)")
  exp = config.get("experiment", {})
  summary = _read_json(os.path.join(run_dir, "summary.json"))
  steps, returns = _read_eval_curve(run_dir)
  complete = summary is not None and summary.get("eval_return") is not None
  s = summary or {}
  agent = str(s.get("agent", exp.get("agent"))) + (f" {point_label(point)}" if point else "")
  return Run(run_dir=run_dir, agent=agent, env=str(s.get("env", exp.get("env"))),
             seed=int(s.get("seed", exp.get("seed", 0))), complete=complete,
             final_return=s.get("eval_return"), best_return=s.get("best_eval_return"),
             threshold=s.get("reward_threshold", exp.get("reward_threshold")),
             steps_to_threshold=s.get("steps_to_threshold"), env_steps=s.get("actor_steps"),
             wall_seconds=s.get("wall_seconds"), curve_steps=steps, curve_returns=returns,
             error="" if complete else (error or "no summary.json (the run did not finish)"))


def _failed_run(run_dir: str, agent: str, env: str, seed: int, error: str) -> Run:
  empty = np.zeros(0)
  return Run(run_dir, agent, env, seed, False, None, None, None, None, None, None,
             empty.astype(np.int64), empty, error)


def load_runs(paths: Sequence[str]) -> List[Run]:
  """Runs from run directories and sweep directories (a folder whose subfolders are runs; its
  sweep.json, when there, also names the seeds that failed before writing a run). ConfigError
  naming the path for one that holds no run."""
  runs: List[Run] = []
  for path in paths:
    if os.path.isfile(os.path.join(path, "config.json")):
      runs.append(load_run(path))
      continue
    if not os.path.isdir(path):
      raise ConfigError("run_dirs", f"'{path}' is not a folder")
    sweep = _read_json(os.path.join(path, SWEEP_FILE)) or {}
    seen = set()
    for entry in sweep.get("runs", []):
      run_dir = os.path.join(path, entry["run_dir"])
      seen.add(os.path.normpath(run_dir))
      error = "" if entry.get("status") == "ok" else entry.get("error", "")
      point = entry.get("point")
      if os.path.isfile(os.path.join(run_dir, "config.json")):
        runs.append(load_run(run_dir, error, point))
      else:
        agent = sweep.get("agent", "?") + (f" {point_label(point)}" if point else "")
        runs.append(_failed_run(run_dir, agent, sweep.get("env", "?"), int(entry["seed"]), error or "no run directory"))
    found = False
    for name in sorted(os.listdir(path)):
      run_dir = os.path.join(path, name)
      if os.path.normpath(run_dir) in seen:
        found = True
      elif os.path.isfile(os.path.join(run_dir, "config.json")):
        runs.append(load_run(run_dir))
        found = True
    if not found and not sweep.get("runs"):
      raise ConfigError("run_dirs", f"'{path}' holds no runs (no config.json in it or its subfolders)")
  return runs


def write_report(out_dir: str, runs: Sequence[Run], reps: int = DEFAULT_REPS, seed: int = 0,
                 curve_reps: int = CURVE_REPS) -> Dict[str, Any]:
  """Writes report.md, report.json and the figures into `out_dir`; returns the report's values."""
  from jrl.experiment.files import write_bytes_atomic, write_json
  report = build_report(runs, reps, seed, curve_reps, base=out_dir)
  os.makedirs(out_dir, exist_ok=True)
  figures = {"curves": curves_figure(report, runs), "aggregates": aggregates_figure(report),
             "steps_to_threshold": steps_to_threshold_figure(report), "profile": profile_figure(report)}
  for key, fig in figures.items():
    fig.savefig(os.path.join(out_dir, FIGURES[key]), dpi=100)
  write_json(os.path.join(out_dir, REPORT_JSON), report)
  write_bytes_atomic(os.path.join(out_dir, REPORT_MD), render_markdown(report).encode())
  return report
