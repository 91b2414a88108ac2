"""The run core: what every run does whatever drives it.

A driver (the embedded loop, `jrl.run.embedded`; the device host loop,
`jrl.run.device.runner`; the distributed program's driver node, `jrl.run.distributed.driver_node.DriverNode`) knows
where acting and learning happen. The core knows the rest:
the run directory and resume, the evaluation history and its threshold rule, evaluator
seeding, metric rows (CSV and TensorBoard) and the progress line, policy snapshots, the
checkpoint schedule, the summary, the plot and the closing lines. `RunCore.drive` is the
one loop every in-process run follows:

    while steps < budget:
      driver.advance(core)            # act and learn; rows through core.write_rows
      evaluate when due (stop at the threshold if asked); checkpoint when due
    evaluate the final parameters, checkpoint, save the final policy

Ctrl-C or SIGTERM stops the loop after the advance under way and checkpoints there
(`jrl.experiment.interrupt`): an interrupted run continues with --resume. An evaluation under way
is abandoned (`stop_requested`, asked by the evaluator at every step): the checkpoint is of the
last whole advance with that evaluation still due, and the resumed run makes it first.

The distributed program's driver node runs the same loop over the program: its advance waits for
the counter's env steps to move, its checkpoints are the learner node's (written where the
learner's state lives, through `save_checkpoint`), and the launcher adds the run report to the
summary afterwards (`add_to_summary`).
"""

import contextlib
import dataclasses
import json
import math
import os
import shutil
import signal
import time
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Protocol, Sequence, Tuple

import numpy as np

from jrl import seeding
from jrl.actors.evaluator import EvaluationAbandoned
from jrl.experiment import files, plots
from jrl.experiment.background import BackgroundWriter
from jrl.experiment.bookkeeping import EvalHistory
from jrl.experiment.checkpoint import (Checkpointer, CheckpointSchedule, FailedWrites, checkpoint_to_resume,
                                      failed_line)
from jrl.experiment.files import REPORT_FILE, SUMMARY_FILE, write_json
from jrl.experiment.interrupt import Interrupts, RunInterrupted
from jrl.experiment.logging import MetricsLogger, Progress, metric_log_positions, open_metric_logs
from jrl.experiment.snapshots import save_policy
from jrl.experiment.summary import make_summary, with_report
from jrl.learners.learner import params_digest
from jrl.timing import CHECKPOINT, EVAL, NULL_TIMER

ROLES = ("actor", "learner", "evaluator")
EVAL_PROGRESS_LINES = 5  # an evaluation's progress line comes every 5 progress lines' seconds


def evaluator_seed(seed: int) -> int:
  """The evaluator's env seed: evaluation k of every run of `seed` (any backend, restarted or
  resumed) plays the same episodes."""
  return seeding.env_seed(seed, "evaluator")


def evaluation_info(row: Dict[str, float], index: int, seed: int, episodes: int) -> Dict[str, Any]:
  """What a policy snapshot records of the evaluation that scored it (enough to replay it)."""
  return {"eval_return": row["eval_return"], "eval_index": index, "eval_seed": seed, "eval_episodes": episodes}


def evaluator_row(actor_steps, learner_steps, row: Dict[str, float], wall_seconds: float, **extra) -> Dict[str, Any]:
  """The evaluator's metric row of one evaluation."""
  return {"actor_steps": actor_steps, "learner_steps": learner_steps, **extra,
          **{k: v for k, v in row.items() if k != "is_best"}, "wall_seconds": wall_seconds}


def actor_row(env_steps: int, episodes: int, episode_return: Optional[float], episode_length: Optional[float],
              steps_per_second: float, wall_seconds: float) -> Dict[str, Any]:
  """The actor's metric row (NaN where no episode ended since the last row)."""
  nan = float("nan")
  return {"actor_steps": env_steps, "episodes": episodes,
          "episode_return": nan if episode_return is None else episode_return,
          "episode_length": nan if episode_length is None else episode_length,
          "steps_per_second": steps_per_second, "wall_seconds": wall_seconds}


def learner_row(env_steps: int, learner_steps: int, learner_metrics: Dict[str, float], updates_per_second: float,
                wall_seconds: float) -> Optional[Dict[str, Any]]:
  """The learner's metric row; None without metrics (no update since the last row)."""
  if not learner_metrics:
    return None
  return {"actor_steps": env_steps, "learner_steps": learner_steps, **learner_metrics,
          "updates_per_second": updates_per_second, "wall_seconds": wall_seconds}


def eval_text(history: EvalHistory) -> str:
  """The progress line's evaluation: the latest return and the best so far."""
  return f"{history.returns[-1]:.1f} (best {max(history.returns):.1f})" if history.returns else "-"


def next_mark(steps: int, mark: int, every: int) -> int:
  """The first multiple of `every` past `mark` that is beyond `steps` (a chunk may pass several)."""
  return mark + every * max(1, math.ceil((steps - mark + 1) / every))


def save_checkpoint(checkpointer: Checkpointer, run_dir: str, learner_state, run_state: Dict[str, Any],
                    counters: Dict[str, Any], write_replay: Optional[Callable[[str], None]],
                    params) -> Tuple[str, Optional[str]]:
  """Writes a checkpoint and the 'latest' policy (`params`, those of the checkpoint's learner) beside
  it: (the checkpoint's path, the failed-write line of the policy when it was not written, else
  None). WriteFailed (or the error) when the checkpoint is not written. The core calls it for an
  in-process driver; the distributed program's learner node calls it where its state lives."""
  path = checkpointer.save(learner_state, run_state, counters, write_replay=write_replay)
  try:
    save_policy(run_dir, "latest", params, {"actor_steps": counters["actor_steps"],
                                            "learner_steps": counters["learner_steps"]})
  except Exception as e:  # noqa: BLE001 - the checkpoint stands; the run records the snapshot it lacks
    return path, failed_line("policy snapshot 'latest'", e)
  return path, None


class WrittenCheckpoint(NamedTuple):
  """What `Driver.checkpoint` returns when the driver wrote the checkpoint itself (through
  `save_checkpoint`, where its learner's state lives: the distributed program's learner node)."""
  path: str
  failed_policy: Optional[str] = None  # save_checkpoint's line for a 'latest' policy not written


def add_to_summary(run_dir: str, report_fields: Mapping[str, Any], **details: Any) -> Dict[str, Any]:
  """Adds the run report's fields and more `details` to RUN_DIR/summary.json (written by
  `RunCore.finish`): what only the distributed program's launcher knows once every node has ended
  (the report from every node's times, restarts, lost hosts). Returns the new summary."""
  path = os.path.join(run_dir, SUMMARY_FILE)
  with open(path) as f:
    summary = with_report(json.load(f), report_fields, **details)
  write_json(path, summary)
  return summary


@dataclasses.dataclass
class RunBooks:
  """The core's counters between iterations; saved in every checkpoint beside the driver's own."""
  history: EvalHistory
  next_log: int
  next_eval: int
  episodes_total: int = 0
  last_eval: Dict[str, Any] = dataclasses.field(default_factory=dict)  # the newest evaluation (evaluation_info)
  last_eval_steps: int = -1
  wall_before: float = 0.0  # wall seconds of the sessions before this one
  sessions: int = 0         # times the run was resumed

  def state(self) -> Dict[str, Any]:
    return {**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}, "history": self.history.state()}

  @classmethod
  def split(cls, state: Dict[str, Any]) -> Tuple["RunBooks", Dict[str, Any]]:
    """The books in a saved state, and the driver's keys beside them."""
    names = {f.name for f in dataclasses.fields(cls)}
    books = cls(**{k: v for k, v in state.items() if k in names})
    books.history = EvalHistory.from_state(books.history)
    return books, {k: v for k, v in state.items() if k not in names}


class Driver(Protocol):
  """Where a run acts and learns. Counts are of the whole run (resumed runs included)."""
  env_steps: int
  learner_steps: int

  def advance(self, core: "RunCore") -> None:
    """Acts and learns up to the next point the core looks at; writes metric rows when
    `core.log_due` says so."""

  def params(self) -> Any:
    """The learner's parameters now, on the host."""

  def evaluate(self, params) -> Tuple[np.ndarray, int]:
    """Greedy episode returns of `params`, and the evaluation's index (its episodes' seeds)."""

  def checkpoint(self, books: Dict[str, Any]) -> Any:
    """(learner state or None, the run state with `books` in it, as data (`checkpoint_formats`),
    the replay writer or None); or a `WrittenCheckpoint` where the driver wrote it itself (with
    `books` in it)."""

  def close(self) -> None: ...

  # Optional: `evaluation_columns() -> Dict` (more columns of the evaluator's row, after the
  # learner steps); `over: bool` (the run's budget is reached, where the driver learns it from
  # elsewhere than its env steps: the distributed program's counter).


class RunCore:
  """One run's directory, books and files; `drive` runs a `Driver` to the budget."""

  def __init__(self, exp, agent_cfg, threshold: Optional[float], before_writing: Callable[[], None] = lambda: None,
               timer=NULL_TIMER, follower_dir: Optional[str] = None, agree: Callable[[bool], bool] = bool,
               writer: Optional[BackgroundWriter] = None, prepared: Optional[Tuple[str, bool]] = None):
    """Reads the checkpoint to resume (exp.resume) and prepares the run directory
    (ConfigError for bad input, before anything is written).

    A process of a multi-process run other than the first (a device run over several hosts) is
    a *follower*: it takes every step, evaluation and checkpoint with the others (they are
    collective), resumes from the same checkpoint, but writes only its own record, fresh each
    session, into `follower_dir` (metrics, summary); the run directory, its checkpoints and
    policies are the first process's. `agree` makes the processes take the same decision where
    it depends on a local clock (a checkpoint every N seconds): the first process's.
    `writer`: rows, progress lines and best-policy snapshots are written on its thread (a
    `BackgroundWriter`, the driver's; it may serve several runs), for a driver whose host thread
    should go back to its device; None: written at once.
    `prepared`: (run directory, whether resumed) of a run whose directory was prepared, and whose
    checkpoint was read, elsewhere: the distributed program's launcher; its driver node keeps the
    books (restored by the driver, `restore_books`), and leaves partial checkpoints to the launcher
    (a learner may be writing one)."""
    self.exp, self.timer, self.follower, self._agree = exp, timer, follower_dir is not None, agree
    self._prepared_resumed = prepared is not None and prepared[1]
    reads_resume = exp.resume and prepared is None
    self.resume_info = checkpoint_to_resume(exp.resume, exp.steps, exp.resume_strict) if reads_resume else None
    self.saved: Optional[Dict[str, Any]] = Checkpointer.read_run_state(self.resume_info) if self.resume_info else None
    if prepared is not None:
      self.run_dir = prepared[0]
    elif self.follower:
      shutil.rmtree(follower_dir, ignore_errors=True)
      os.makedirs(follower_dir)
      self.run_dir = os.path.abspath(follower_dir)
    else:
      self.run_dir = files.prepare_run_dir(exp, agent_cfg, before_writing=before_writing)
    self.checkpointer = Checkpointer(self.run_dir, exp.keep_checkpoints)
    if prepared is None:
      self.checkpointer.clean_partial()
    self.failed_writes = FailedWrites()
    self.evaluator_seed = evaluator_seed(exp.seed)
    self.books = RunBooks(EvalHistory(threshold), exp.log_every, exp.eval_every)
    self.writer = writer
    self._start = time.monotonic()
    self.checkpointed: Tuple[int, Optional[str]] = (-1, None)  # env steps and path of this session's newest
    self._interrupts: Optional[Interrupts] = None  # drive's, while it runs

  def stop_requested(self) -> bool:
    """Whether a signal asked the run to stop (Ctrl-C, SIGTERM during `drive`): the evaluator's
    stop predicate, for a long evaluation to end within a step of it."""
    return self._interrupts is not None and self._interrupts.signum is not None

  def eval_progress(self, text: str) -> None:
    """A long evaluation's progress line (`Evaluator`'s `progress`; silent where progress lines are)."""
    self.progress.maybe_print(text, force=True)

  @property
  def eval_progress_seconds(self) -> float:
    """Seconds between a long evaluation's progress lines (`Evaluator`'s `progress_seconds`): those of
    EVAL_PROGRESS_LINES progress lines (10 s by default), so a short evaluation prints none."""
    return EVAL_PROGRESS_LINES * self.exp.progress_seconds

  @property
  def resumed(self) -> bool:
    return self.saved is not None or self._prepared_resumed

  def restore_books(self, state: Dict[str, Any], new_session: bool = True) -> Dict[str, Any]:
    """Takes the books from a checkpoint's saved state (`new_session`: a resumed run's, whose
    sessions count one more; else a restarted driver's, continuing this session); returns the
    driver's keys."""
    self.books, rest = RunBooks.split(state)
    self.books.sessions += int(new_session)
    return rest

  def open(self, env_steps: int, progress_prefix: str, loggers: Optional[Dict[str, MetricsLogger]] = None) -> None:
    """Opens the metric logs (a resumed run drops what was logged after its checkpoint), the
    progress line and the checkpoint schedule. `loggers`: the driver's own (the distributed
    program's driver node has the evaluator's; its other nodes write their own rows)."""
    positions = self.saved["positions"] if self.saved is not None and not self.follower else None
    if loggers is not None:
      self.tb, self.loggers = None, dict(loggers)
    else:
      self.tb, self.loggers = open_metric_logs(self.run_dir, ROLES, positions)
    self.progress = Progress(progress_prefix, self.exp.progress_seconds)
    self.schedule = CheckpointSchedule(self.exp.checkpoint_every_steps, self.exp.checkpoint_every_seconds, env_steps)

  def start_clock(self, at: Optional[float] = None) -> None:
    """Wall seconds (metrics, summary) count from now (or `at`, a time.monotonic()), plus the
    earlier sessions'."""
    self._start = time.monotonic() if at is None else at

  def elapsed(self) -> float:
    return self.books.wall_before + time.monotonic() - self._start

  def log_due(self, env_steps: int) -> bool:
    """Whether a metric row is due (and the next one scheduled)."""
    if env_steps < self.books.next_log:
      return False
    self.books.next_log = next_mark(env_steps, self.books.next_log, self.exp.log_every)
    return True

  def write_rows(self, env_steps: int, learner_steps: int, episode_return: Optional[float],
                 episode_length: Optional[float], steps_per_second: float, updates_per_second: float,
                 learner_metrics: Dict[str, float], wall_seconds: float) -> None:
    """The actor's row, the learner's (when it has metrics) and the progress line."""
    actor = actor_row(env_steps, self.books.episodes_total, episode_return, episode_length, steps_per_second,
                      wall_seconds)
    learner = learner_row(env_steps, learner_steps, learner_metrics, updates_per_second, wall_seconds)
    progress = self.row_progress_text(env_steps, learner_steps, episode_return, steps_per_second, updates_per_second)

    def write() -> None:
      self.loggers["actor"].write(actor)
      if learner is not None:
        self.loggers["learner"].write(learner)
      self.progress.maybe_print(progress)
    self.submit(write)

  def row_progress_text(self, env_steps: int, learner_steps: int, episode_return: Optional[float],
                        steps_per_second: float, updates_per_second: float) -> str:
    """The progress line of a metric row."""
    episode_text = "-" if episode_return is None else f"{episode_return:.1f}"
    return self.progress_text(env_steps, steps_per_second, f"{learner_steps} ({updates_per_second:.0f}/s)",
                              f"episode return {episode_text}")

  def progress_text(self, env_steps: float, steps_per_second: float, updates: str, episodes: str,
                    after: str = "") -> str:
    """The progress line: env steps of the budget, their rate, the learner's updates and the
    episodes as the driver words them, the evaluations, and `after` (a lost host)."""
    return (f"steps {env_steps:.0f}/{self.exp.steps} | {steps_per_second:.0f} env-steps/s | updates {updates} | "
            f"{episodes} | eval {eval_text(self.books.history)}" + (f" | {after}" if after else ""))

  def submit(self, write: Callable[[], None]) -> None:
    """A file write: on the background writer where the run has one, else now."""
    if self.writer is not None:
      self.writer.submit(write)
    else:
      write()

  def drain(self) -> None:
    """Every write handed to the background writer done (raising the first that failed)."""
    if self.writer is not None:
      self.writer.drain()

  def _snapshot(self, name: str, params, driver: Driver, **extra) -> None:
    self.snapshot_at(name, params, driver.env_steps, driver.learner_steps, **extra)

  def snapshot_at(self, name: str, params, env_steps: int, learner_steps: int, **extra) -> None:
    if self.follower:
      return
    with self.timer.phase(CHECKPOINT), self.failed_writes.attempt(f"policy snapshot '{name}'"):
      save_policy(self.run_dir, name, params, {"actor_steps": env_steps, "learner_steps": learner_steps, **extra})

  def evaluate(self, driver: Driver) -> None:
    """Evaluates the driver's parameters now (`driver.evaluate`) and records it; records nothing
    when the evaluation was abandoned at a stop (it stays due)."""
    with self.timer.phase(EVAL):
      params = driver.params()
      try:
        returns, index = driver.evaluate(params)
      except EvaluationAbandoned:
        return
      columns = getattr(driver, "evaluation_columns", None)
      self.record_evaluation(driver, returns, index, params, columns=columns() if columns is not None else None)

  def record_evaluation(self, driver: Driver, returns, index: int, params, mean: Optional[float] = None,
                        wall_seconds: Optional[float] = None,
                        columns: Optional[Dict[str, Any]] = None) -> Dict[str, float]:
    """Records evaluation `index` of the driver's parameters at its current counts (made now, or
    made by the driver itself: the device loop evaluates inside its compiled chunk): the
    evaluator's row, the books (the next evaluation is scheduled past these steps), and the best
    policy when it is a new best (`params`: the evaluated parameters; None where a later
    evaluation of the same chunk supersedes them). `mean`: the mean return as the driver computed
    it (its best and threshold decisions must be the host's). `columns`: the driver's own in the
    row. Returns the row."""
    books = self.books
    if driver.env_steps >= books.next_eval:
      books.next_eval = next_mark(driver.env_steps, books.next_eval, self.exp.eval_every)
    books.last_eval_steps = driver.env_steps
    row = books.history.record(driver.env_steps, returns, mean=mean)
    wall = self.elapsed() if wall_seconds is None else wall_seconds
    written = evaluator_row(driver.env_steps, driver.learner_steps, row, wall, **(columns or {}))
    books.last_eval = info = evaluation_info(row, index, self.evaluator_seed, self.exp.eval_episodes)
    counts = (driver.env_steps, driver.learner_steps)

    def write() -> None:
      self.loggers["evaluator"].write(written)
      if row["is_best"] and params is not None:
        self.snapshot_at("best", params, *counts, **info)
    self.submit(write)
    return row

  def book_evaluations(self, actor_steps: Sequence[int], means: Sequence[float], episodes: int) -> List[bool]:
    """Books evaluations a driver made on its own (a device chunk's), at these env steps with
    these mean returns, in order, as `record_evaluation` books each: the next evaluation is
    scheduled past them, the history takes them, the newest is `last_eval`. Their rows are the
    driver's to write (`evaluator_row`). Whether each was a new best."""
    books = self.books
    first_index = books.history.count
    for steps in actor_steps:
      if steps >= books.next_eval:
        books.next_eval = next_mark(steps, books.next_eval, self.exp.eval_every)
    bests = books.history.extend(actor_steps, means)
    if means:
      books.last_eval_steps = int(actor_steps[-1])
      books.last_eval = evaluation_info({"eval_return": float(means[-1])}, first_index + len(means) - 1,
                                        self.evaluator_seed, episodes)
    return bests

  def checkpoint(self, driver: Driver) -> None:
    """A checkpoint of the driver's state and the books, and the 'latest' policy; a failed
    write is recorded and the run goes on."""
    self.drain()  # the logs' positions it records are those of every row so far
    written: Optional[WrittenCheckpoint] = None
    with self.timer.phase(CHECKPOINT), self.failed_writes.attempt("checkpoint"):
      self.schedule.done(driver.env_steps)  # a failed checkpoint is not retried at once
      books = self.books.state()
      books["wall_before"] = self.elapsed()
      state = driver.checkpoint(books)
      self.checkpointed = (driver.env_steps, None)  # every process alike, written or not
      if isinstance(state, WrittenCheckpoint):
        written = state
      elif self.follower:
        return  # it took part in gathering the state; the first process saves it
      else:
        learner_state, run_state, write_replay = state
        run_state["positions"] = metric_log_positions(self.tb, self.loggers)
        counters = {"actor_steps": driver.env_steps, "learner_steps": driver.learner_steps,
                    "episodes": self.books.episodes_total, "evaluations": self.books.history.count}
        written = WrittenCheckpoint(*save_checkpoint(self.checkpointer, self.run_dir, learner_state, run_state,
                                                     counters, write_replay, driver.params()))
      self.checkpointed = (driver.env_steps, written.path)
    if written is not None and written.failed_policy is not None:
      self.failed_writes.record(written.failed_policy)

  def over(self, driver: Driver) -> bool:
    """Whether the run has reached its budget: the driver's env steps, or where the driver learns
    it from elsewhere (`driver.over`: the distributed program's counter, the one place that decides
    it for every node), its word."""
    over = getattr(driver, "over", None)
    return bool(over) if over is not None else driver.env_steps >= self.exp.steps

  def drive(self, driver: Driver, signals: bool = True) -> Any:
    """Runs `driver` to the budget (or the threshold, with stop_at_threshold), then evaluates
    the final parameters, checkpoints and saves the final policy; returns those parameters.
    The logs and the driver are closed however it ends; at Ctrl-C or SIGTERM, after a checkpoint
    of the last whole advance (`interrupted`). `signals` False: the signals are not the run's to
    take (a node of the distributed program, which Launchpad stops with SIGTERM)."""
    try:
      with Interrupts() if signals else contextlib.nullcontext(Interrupts()) as interrupts:
        self._interrupts = interrupts

        def settle() -> bool:  # after an advance: whether the run stops here; RunInterrupted at a signal
          if self.after_advance(driver):
            return True
          self.interrupted(driver, interrupts.signum)
          return False

        # A checkpoint of a stop that abandoned an evaluation: the run goes on from the end of that advance.
        stopped = self.evaluation_left_due(driver) and settle()
        while not stopped and not self.over(driver):
          driver.advance(self)
          stopped = settle()
        return self.conclude(driver)
    finally:
      self._interrupts = None
      self.close(driver)

  def evaluation_left_due(self, driver: Driver) -> bool:
    """Whether an evaluation is due at the driver's steps and was not made there: a checkpoint
    written at a stop that abandoned it (every other checkpoint follows its steps' evaluation)."""
    return driver.env_steps >= self.books.next_eval and self.books.last_eval_steps != driver.env_steps

  def interrupted(self, driver: Driver, signum: Optional[int]) -> None:
    """Between advances: at a signal (`Interrupts.signum`; every process takes the first's
    decision), checkpoints the run as it stands unless this session's newest checkpoint is already
    at these steps, and raises RunInterrupted."""
    if not self._agree(signum is not None):
      return
    signum = signum if signum is not None else signal.SIGINT  # a follower stops with the first process
    if self.checkpointed[0] != driver.env_steps:
      self.checkpoint(driver)
    steps, path = self.checkpointed
    raise RunInterrupted(signum, driver.env_steps, path if steps == driver.env_steps else None)

  def after_advance(self, driver: Driver, may_stop: bool = True) -> bool:
    """Evaluates (unless the driver has already evaluated at these steps) and checkpoints when
    due; whether the run stops here (its threshold reached at its latest evaluation, with
    stop_at_threshold and `may_stop`)."""
    exp, books = self.exp, self.books
    if driver.env_steps >= books.next_eval:
      self.evaluate(driver)
    if (may_stop and exp.stop_at_threshold and books.history.reached
        and books.last_eval_steps == driver.env_steps):
      return True
    if self._agree(self.schedule.due(driver.env_steps)) and not self.over(driver):  # the last one follows
      self.checkpoint(driver)
    return False

  def conclude(self, driver: Driver) -> Any:
    """The end of the loop: an evaluation of the final parameters (unless the last one was of
    them), a checkpoint and the final policy; returns the final parameters."""
    if self.books.last_eval_steps != driver.env_steps:
      self.evaluate(driver)
      if self._interrupts is not None:  # a stop during the final evaluation: the run is not over
        self.interrupted(driver, self._interrupts.signum)
    self.checkpoint(driver)
    final_params = driver.params()
    self._snapshot("final", final_params, driver, **self.books.last_eval)
    return final_params

  def close(self, driver: Driver) -> None:
    """Closes the driver and, the background writer's writes done, the metric logs."""
    try:
      driver.close()
      self.drain()
    finally:
      for logger in self.loggers.values():
        logger.close()
      if self.tb is not None:
        self.tb.close()

  def finish(self, driver: Driver, final_params, wall: float, report_result, report_fields, *, kind: str,
             replay: str, learner_devices: int, learner_processes: int, details: Dict[str, Any],
             plot_title: str, done_extra: str = "", curves: Optional[List[plots.Curve]] = None) -> Dict[str, Any]:
    """Writes summary.json and the learning curve, prints the report's verdict and the done
    line; RunWritesFailed if a checkpoint or snapshot was not written. Returns the summary.
    `report_result` None: the report comes later (the distributed program's launcher writes it
    once every node has ended, `add_to_summary`). `curves`: the learning curve is added to it, for
    `draw_learning_curves` to draw with the other runs' that ended with this one, not drawn now."""
    exp, books = self.exp, self.books
    summary = make_summary(
        exp=exp, kind=kind, replay=replay, actor_steps=driver.env_steps, learner_steps=driver.learner_steps,
        episodes=books.episodes_total, wall_seconds=wall, history=books.history.summary(),
        learner_devices=learner_devices, learner_processes=learner_processes, resumed=self.resumed,
        checkpoints=[os.path.basename(p) for p in self.checkpointer.all()], params_digest=params_digest(final_params),
        failed_writes=self.failed_writes.lines, report_fields=report_fields, details=details)
    write_json(os.path.join(self.run_dir, SUMMARY_FILE), summary)
    curve = plots.Curve(self.run_dir, plot_title, books.history.threshold)
    if curves is None:
      plots.plot_learning_curve(*curve)
    else:
      curves.append(curve)
    if report_result is not None:
      self.progress.maybe_print(f"report: {report_result.advice} ({os.path.join(self.run_dir, REPORT_FILE)})",
                                force=True)
    self.progress.maybe_print(f"done: {driver.env_steps} steps in {wall:.1f}s{done_extra} | eval "
                              f"{summary['eval_return']:.1f} (best {summary['best_eval_return']:.1f}) | steps to "
                              f"threshold {summary['steps_to_threshold']} | {self.run_dir}", force=True)
    self.failed_writes.check(self.run_dir)
    summary["run_dir"] = self.run_dir
    return summary


def draw_learning_curves(curves: Sequence[plots.Curve], workers: Optional[int] = None) -> List[str]:
  """The learning curves of runs that ended together (`RunCore.finish`'s `curves`: a vmapped
  sweep's), drawn at once: by `workers` processes of their own (default: as many as repay their
  start on this machine's cores, `plots.plot_workers`). Their paths."""
  return plots.plot_learning_curves(curves, workers)
