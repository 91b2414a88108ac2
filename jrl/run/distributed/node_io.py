"""What every node of a distributed program reads and writes about itself: its session of the run,
its incarnation and seeds, its log lines, its metrics and its phase-times file. Engine-independent:
the engine that started the node said in its environment which run and incarnation it is
(`node_env`)."""

import dataclasses
import json
import os
import threading
import time
from typing import Any, Callable, Dict, Optional

import jax
import numpy as np

from jrl import seeding
from jrl.experiment.logging import MetricsLogger, TensorBoard, last_step
from jrl.run.distributed.node_env import INCARNATION_ENV, RUN_DIR_ENV

LOG_SECONDS = 1.0  # how often actors and learners report counts and write a metrics row
# Where nodes write their phase times for the run report (the launcher reads them), and how often.
TIMES_DIR = os.path.join("logs", "times")
TIMES_EVERY_SECONDS = 2.0


@dataclasses.dataclass(frozen=True)
class Session:
  """What a node needs to know about this launch of the program beyond its config."""
  run_dir: str
  number: int = 0                 # 0 for a new run, n for its n-th resume
  checkpoint: Optional[str] = None  # the checkpoint a resumed program starts from


def incarnation() -> int:
  """How many times this node's process has been restarted (0: the first one)."""
  return int(os.environ.get(INCARNATION_ENV, "0"))


def node_seeds(seed: int, role: str, index: int, session: int = 0) -> seeding.NodeSeeds:
  """Env seed and key of this incarnation of a node in this session of the run: a restarted
  or resumed one does not replay its predecessor's episodes."""
  key = seeding.node_key(seed, role, index)
  fresh = 1_000 * session + incarnation()
  return seeding.NodeSeeds(seeding.env_seed(seed, role, index, fresh),
                           jax.random.fold_in(key, fresh) if fresh else key)


def continues(session: Session) -> bool:
  """Whether this node continues earlier work: restarted, or part of a resumed run."""
  return bool(incarnation() or session.number)


def host_name() -> str:
  """The placement's name of this host (multi-host launches), else 'local'."""
  return os.environ.get("JRL_HOST", "local")


def log(text: str) -> None:
  """A line in this node's log (its stdout, which the engine keeps in the run's logs/)."""
  print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def continued_exploration(state: Any, env_steps: float) -> Any:
  """A restarted node's policy state with the env-step count that drives exploration
  schedules set to `env_steps` (one actor's share of the program's steps so far), so
  that it does not start exploring from scratch. States without one are returned as is."""
  if not (hasattr(state, "_replace") and hasattr(state, "env_steps")):
    return state
  return state._replace(env_steps=np.full(np.shape(state.env_steps), int(env_steps), np.asarray(state.env_steps).dtype))


def metrics_logger(session: Session, role: str, step_key: str = "actor_steps") -> MetricsLogger:
  """The node's metrics, in its CSV and its own TensorBoard folder (tensorboard/<role>/); a
  restarted or resumed node appends to its predecessor's rows (a resumed run has cut them back
  to its checkpoint) and has TensorBoard drop the predecessor's points after the last of them."""
  path = os.path.join(session.run_dir, "metrics", f"{role}.csv")
  resume_from = os.path.getsize(path) if continues(session) and os.path.exists(path) else None
  last = last_step(path, step_key) if resume_from is not None else None
  tb = TensorBoard(session.run_dir, subdir=role, continue_after=last, flush_each=True)
  return MetricsLogger(session.run_dir, role, tb, step_key=step_key, resume_from=resume_from)


def exit_soon_after_stop(stop: threading.Event, grace_seconds: float = 5.0) -> None:
  """Ends this node's process `grace_seconds` after the program's `stop`, wherever its main thread
  is (still compiling, or waiting on a peer that is gone): a node must not outlive the program
  (Launchpad kills the whole runtime, launcher included, when one lingers). Only in a process of
  its own, which the engine marks with RUN_DIR_ENV: under local_mt the nodes are threads of the
  launcher."""
  if not os.environ.get(RUN_DIR_ENV):
    return

  def watchdog():
    stop.wait()
    time.sleep(grace_seconds)
    os._exit(0)

  threading.Thread(target=watchdog, name="exit-after-stop", daemon=True).start()


def times_folder(run_dir: str, session_number: int) -> str:
  return os.path.join(run_dir, TIMES_DIR, f"session{session_number}")


class TimesFile:
  """One node's phase times (`PhaseTimer`s, as `NodeTimes` dicts) and counts for the run
  report, written to `logs/times/session<n>/<name>.<incarnation>.json` every
  TIMES_EVERY_SECONDS (`maybe_write`) and when the node ends (`write`): a node killed
  without warning still leaves its last few seconds' books."""

  def __init__(self, session: Session, name: str, collect: Callable[[], Dict[str, Any]]):
    self._path = os.path.join(times_folder(session.run_dir, session.number),
                              f"{name.replace('/', '-')}.{incarnation()}.json")
    self._collect = collect
    self._last = time.monotonic()

  def maybe_write(self) -> None:
    if time.monotonic() - self._last >= TIMES_EVERY_SECONDS:
      self.write()

  def write(self) -> None:
    self._last = time.monotonic()
    os.makedirs(os.path.dirname(self._path), exist_ok=True)
    tmp = f"{self._path}.tmp"
    with open(tmp, "w") as f:
      json.dump(self._collect(), f)
    os.replace(tmp, self._path)

  def write_every(self, stop: threading.Event) -> None:
    """Writes periodically from a thread of its own until `stop`."""
    def loop():
      while not stop.wait(TIMES_EVERY_SECONDS):
        self.write()
    threading.Thread(target=loop, name="times-file", daemon=True).start()
