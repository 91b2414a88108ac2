"""summary.json: one schema for every kind of run (embedded, distributed, device).

The top level is the same for all three: what ran and on which stack (`stack`: 'full' or 'core', with
the Python and JAX versions), how far it got, how it scored, where the
checkpoints are, the parameter digest and the run report's verdict with the rates it measured.
What only one kind of run has (a distributed run's inference batches and lost hosts, a device
run's compile seconds, an embedded run's first and last step times) is in `details`, and
`kind` says which kind of run wrote it.

  summary["eval_return"], summary["rates"]["env_steps_per_second"], summary["details"]["loop_compiles"]
"""

from typing import Any, Dict, Mapping, Optional, Sequence

from jrl import compat

KINDS = ("embedded", "distributed", "device")

# Every summary.json has exactly these keys, in this order.
KEYS = (
    "agent", "env", "seed", "kind", "replay", "stack", "python_version", "jax_version",
    "actor_steps", "learner_steps", "episodes", "wall_seconds",
    "eval_return", "best_eval_return", "evaluations", "reward_threshold", "steps_to_threshold",
    "learner_devices", "learner_processes", "resumed", "checkpoints", "params_digest", "failed_writes",
    "bottleneck", "bottleneck_node", "bottleneck_advice", "rates", "phase_seconds", "phase_wall_seconds",
    "details",
)
# The run report's fields (jrl.experiment.report.summary_fields), at the top level.
REPORT_KEYS = ("bottleneck", "bottleneck_node", "bottleneck_advice", "rates", "phase_seconds", "phase_wall_seconds")


def make_summary(*, exp: Any, kind: str, replay: str, actor_steps: int, learner_steps: int, episodes: int,
                 wall_seconds: float, history: Mapping[str, Any], learner_devices: int, learner_processes: int,
                 resumed: bool, checkpoints: Sequence[str], params_digest: str, failed_writes: Sequence[str],
                 report_fields: Optional[Mapping[str, Any]], details: Optional[Mapping[str, Any]] = None
                 ) -> Dict[str, Any]:
  """The summary of a run of `kind`; `history` is `EvalHistory.summary()`, `report_fields` what
  `jrl.experiment.report.write_report` returned (None: not yet, see `with_report`), `details` the
  kind's own keys."""
  if kind not in KINDS:
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
  stack = compat.stack()
  summary = {
      "agent": exp.agent, "env": exp.env, "seed": exp.seed, "kind": kind, "replay": replay,
      "stack": stack.name, "python_version": stack.python, "jax_version": stack.jax,
      "actor_steps": int(actor_steps), "learner_steps": int(learner_steps), "episodes": int(episodes),
      "wall_seconds": round(float(wall_seconds), 3),
      **{k: history[k] for k in ("eval_return", "best_eval_return", "evaluations", "reward_threshold",
                                 "steps_to_threshold")},
      "learner_devices": int(learner_devices), "learner_processes": int(learner_processes), "resumed": bool(resumed),
      "checkpoints": list(checkpoints), "params_digest": params_digest, "failed_writes": list(failed_writes),
      **{k: report_fields[k] if report_fields is not None else None for k in REPORT_KEYS},
      "details": dict(details or {}),
  }
  assert tuple(summary) == KEYS, tuple(summary)
  return summary


def with_report(summary: Mapping[str, Any], report_fields: Mapping[str, Any], **details: Any) -> Dict[str, Any]:
  """`summary` with the run report's fields and more `details`: a distributed run's evaluator writes
  the summary when the program ends, and the launcher adds what only it knows (the report from
  every node's times, restarts, lost hosts)."""
  if tuple(summary) != KEYS:
    raise ValueError(f"not a summary of this schema: keys {sorted(set(summary) ^ set(KEYS))} differ")
  return {**summary, **{k: report_fields[k] for k in REPORT_KEYS}, "details": {**summary["details"], **details}}
