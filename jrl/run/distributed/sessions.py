"""A distributed run's sessions, whichever engine runs its nodes: the run directory a new run gets,
the checkpoint a resumed one continues from (with its nodes' metrics cut back to it), and the
restarts its nodes had."""

import csv
import glob
import os
from typing import Any, Dict, Mapping, Optional, Tuple

from jrl.experiment.checkpoint import Checkpointer, checkpoint_to_resume
from jrl.experiment.config import ExperimentConfig
from jrl.experiment.files import prepare_run_dir
from jrl.experiment.logging import cut_rows
from jrl.run.distributed.node_env import RESTARTS_FILE
from jrl.run.distributed.node_io import Session


class ProgramStopped(KeyboardInterrupt):
  """The program was stopped from outside (Ctrl-C, SIGTERM, lp.stop) before its driver node ended
  the run. `signum`: the signal the launcher got (None: not known, e.g. Launchpad's local_mt)."""

  def __init__(self, run_dir: str, signum: Optional[int] = None):
    super().__init__(run_dir)
    self.run_dir, self.signum = run_dir, signum


def prepare_session(exp: ExperimentConfig, agent_cfg) -> Tuple[Session, Optional[Dict[str, Any]]]:
  """The run directory of a new run (created, config.json written), or the checkpoint a
  resumed one continues from (its metrics cut back to it); ConfigError for bad input."""
  if not exp.resume:
    run_dir = os.path.abspath(prepare_run_dir(exp, agent_cfg))
    os.makedirs(os.path.join(run_dir, "logs"), exist_ok=True)
    return Session(run_dir), None
  run_dir = os.path.abspath(exp.resume)
  info = checkpoint_to_resume(run_dir, exp.steps, exp.resume_strict)
  if info is None:
    return Session(run_dir), None
  saved = Checkpointer.read_run_state(info)
  Checkpointer(run_dir).clean_partial()
  cut_metrics_to_checkpoint(run_dir, saved)
  return Session(run_dir, saved.get("sessions", 0) + 1, info.path), saved["counter"]


def cut_metrics_to_checkpoint(run_dir: str, saved: Mapping[str, Any]) -> None:
  """Cuts the nodes' metrics back to what the checkpoint `saved` holds: actor rows to its env
  steps, learner rows to its learner steps, evaluator rows to its evaluation history. Not the
  evaluator's to its env steps: an evaluation that read the counter before the checkpoint and
  recorded itself after it has a row at or below the checkpoint's steps but is not in its
  history, and the resumed evaluator runs that evaluation again."""
  counts = saved["counter"]["counts"]
  metrics = os.path.join(run_dir, "metrics")
  for path in glob.glob(os.path.join(metrics, "actor*.csv")):
    cut_rows(path, "total_actor_steps", counts.get("actor_steps", 0))
  for path in glob.glob(os.path.join(metrics, "learner*.csv")):
    cut_rows(path, "learner_steps", saved["learner_steps"])
  evaluated = (saved["counter"].get("eval_history") or {}).get("actor_steps") or []
  cut_rows(os.path.join(metrics, "evaluator.csv"), "actor_steps", evaluated[-1] if evaluated else -1)


def restart_counts(run_dir: str) -> Dict[str, int]:
  """Restarts per node over the whole run, from metrics/restarts.csv (written by every host's supervisor)."""
  path = os.path.join(run_dir, RESTARTS_FILE)
  counts: Dict[str, int] = {}
  if os.path.exists(path):
    with open(path, newline="") as f:
      for row in csv.DictReader(f):
        counts[row["node"]] = counts.get(row["node"], 0) + 1
  return counts


