"""The program's driver node: the run core's loop (`jrl.run.core`) over the program, as the embedded
and device runs follow it in-process. It evaluates the learner's parameters on the core's schedule,
saves the best and final policies, prints progress, has the learner checkpoint, writes the summary
and the learning curve, and then stops the program. Its Launchpad group keeps the name "evaluator"."""

import os
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from jrl.actors.evaluator import Evaluator
from jrl.errors import Stopped
from jrl.experiment import report
from jrl.experiment.builder import build_agent_parts, success_threshold
from jrl.experiment.checkpoint import RunWritesFailed
from jrl.experiment.config import ExperimentConfig
from jrl.run.core import RunCore, WrittenCheckpoint, next_mark
from jrl.run.distributed import liveness
from jrl.run.distributed.node_io import Session, TimesFile, exit_soon_after_stop, log, metrics_logger
from jrl.run.distributed.rpc import wait_unless_stopped

# Longest the driver node waits for an inference server's statistics at the end.
STATS_TIMEOUT_SECONDS = 10.0
# The driver node repeats a progress line whose env steps (and lost hosts) have not changed only this
# often: while the actors start (imports, compiles) the count stays at its start, and one line says so.
STILL_PROGRESS_SECONDS = 30.0


class ProgramDriver:
  """The run core's `Driver` over the distributed program, in the driver node: `advance` waits
  for the counter's env steps to move (and shows the progress line, with the hosts the launcher
  found lost); `params` are the learner's variables (fetched once per look at the counter, so that
  the final policy, its evaluation and the summary's digest are of the same parameters); `evaluate`
  is the node's `Evaluator`; `checkpoint` is the learner node's (which writes it where its state
  lives); `over` is the counter's word on the budget.

  The run core's books are kept in the counter too (`Counter.set_books`): a restarted driver node,
  or a resumed run's, continues them, and evaluation k plays the same episodes whoever runs it."""

  def __init__(self, exp: ExperimentConfig, parts, agent_cfg, learner, counter, core: RunCore, session: Session,
               timer: report.PhaseTimer, times: TimesFile, stop: threading.Event):
    self._exp, self._learner, self._counter, self._session = exp, learner, counter, session
    self._timer, self._times, self._stop = timer, times, stop
    books = self._wait(counter.future("get_books"))
    if books is None:  # a fresh run, or a checkpoint written when the counter held the history alone
      history = self._wait(counter.future("get_eval_history"))
      books = core.books.state() if history is None else legacy_books(history, exp)
    core.restore_books(books)
    core.books.sessions = session.number
    self.evaluator = Evaluator(exp.env, parts.agent.make_policy(parts.networks, agent_cfg, evaluation=True),
                               exp.eval_episodes, seed=core.evaluator_seed, first_index=core.books.history.count,
                               should_stop=stop.is_set, progress=core.eval_progress,  # the program's stop
                               progress_seconds=core.eval_progress_seconds)
    self.over: bool = self._wait(counter.future("over"))  # before the counts: see _look
    self._counts: Dict[str, float] = self._wait(counter.future("get_counts"))
    self._last_time = time.monotonic()
    self._params, self.version = None, None
    self._printed: Tuple[Any, float] = (None, 0.0)  # the env steps (and lost hosts) of the last progress line, when

  def _wait(self, future):
    return wait_unless_stopped(future, self._stop)

  @property
  def env_steps(self) -> int:
    return int(self._counts.get("actor_steps", 0))

  @property
  def learner_steps(self) -> int:
    return int(self._counts.get("learner_steps", 0))

  def advance(self, core: RunCore) -> None:
    self._counter.future("set_books", core.books.state())  # what was recorded since the last look
    start = self.env_steps
    while True:
      if self._pause():
        raise Stopped("program stopping")
      self._times.maybe_write()
      self._look(core)
      self._show_progress(core)
      if self.env_steps != start or self.over:
        return

  def _pause(self) -> bool:
    """Waits a moment (idle); whether the program is stopping."""
    self._timer.enter(report.IDLE)
    try:
      return self._stop.wait(0.2)
    finally:
      self._timer.exit()

  def _look(self, core: RunCore) -> None:
    """The counter's counts and word on the budget; the program's wall seconds (counted here, so
    that a restarted driver node continues them) are the core's clock."""
    now = time.monotonic()
    # The budget's word first, the counts after: counts only grow, so counts read after `over`
    # said yes are at or past the budget (read the other way round, an actor's last report could
    # land between the two, and a finished run's summary said 3,296 of its 3,300 steps).
    self.over = self._wait(self._counter.future("over"))
    self._counts = self._wait(self._counter.future("increment", wall_seconds=now - self._last_time))
    self._last_time = now
    self._params = None
    core.books.episodes_total = int(self._counts.get("episodes", 0))
    core.books.wall_before = self._counts.get("wall_seconds", 0.0)
    core.start_clock(now)

  def _show_progress(self, core: RunCore) -> None:
    counts = self._counts
    lost = liveness.describe_lost(liveness.read_lost(self._session.run_dir))
    moved = (self.env_steps, lost) != self._printed[0] or time.monotonic() - self._printed[1] >= STILL_PROGRESS_SECONDS
    rate = self.env_steps / max(counts.get("wall_seconds", 0.0), 1e-9)
    if (moved or self.over) and core.progress.maybe_print(
        core.progress_text(self.env_steps, rate, f"{counts.get('learner_steps', 0):.0f}",
                           f"episodes {counts.get('episodes', 0):.0f}", f"lost {lost}" if lost else ""),
        force=self.over):
      self._printed = ((self.env_steps, lost), time.monotonic())

  def params(self):
    if self._params is None:
      self._params, self.version = self._wait(self._learner.future("get_variables"))
    return self._params

  def evaluate(self, params):
    index = self.evaluator.next_index
    return self.evaluator.run(params), index

  def evaluation_columns(self) -> Dict[str, Any]:
    return {"learner_version": self.version,
            "lost_nodes": len(liveness.lost_nodes(liveness.read_lost(self._session.run_dir)))}

  def checkpoint(self, books: Dict[str, Any]) -> WrittenCheckpoint:
    self._wait(self._counter.future("set_books", books))  # in the checkpoint's counter
    path, failed_policy = self._wait(self._learner.future("checkpoint"))
    # The learner brought the counter's learner steps up to its checkpoint's: the summary's are as of it.
    self._counts["learner_steps"] = self._wait(self._counter.future("get_counts")).get("learner_steps", 0.0)
    return WrittenCheckpoint(path, failed_policy)

  def close(self) -> None:
    self.evaluator.close()


def legacy_books(history: Dict[str, Any], exp: ExperimentConfig) -> Dict[str, Any]:
  """The run core's books from an evaluation history alone (a checkpoint written before the
  counter kept the books): the next evaluation is the first evaluation point past the last one."""
  evaluated = history["actor_steps"]
  last = evaluated[-1] if evaluated else 0
  return {"history": history, "next_log": exp.log_every, "next_eval": next_mark(last, 0, exp.eval_every),
          "last_eval_steps": last if evaluated else -1}


class DriverNode:
  """The program's driver: runs the run core's loop (`RunCore.drive`) over the program with a
  `ProgramDriver`, as the embedded and device runs do in-process. The run ends when the counter
  says the budget is reached (or the threshold, with stop_at_threshold); the launcher adds the run
  report, restarts and lost hosts to the summary afterwards."""

  def __init__(self, exp: ExperimentConfig, agent_cfg, learner, counter, inference_servers, session: Session,
               replay=None, *, engine):
    self._exp, self._cfg, self._engine = exp, agent_cfg, engine
    self._learner, self._counter = engine.handle(learner), engine.handle(counter)
    self._replay = engine.replay(replay) if replay is not None else None
    self._servers, self._session = [engine.handle(server) for server in inference_servers], session

  def run(self):
    self._stop = stop = self._engine.stop_event()
    exit_soon_after_stop(stop)
    exp, cfg, session = self._exp, self._cfg, self._session
    parts = build_agent_parts(exp.agent, exp.env, cfg)
    # Not a stage of the pipeline (actors do not wait on it): a helper in the run report.
    timer = report.PhaseTimer()
    times = TimesFile(session, "evaluator/0",
                      lambda: {"nodes": [timer.node("evaluator/0", "evaluator", helper=True).as_dict()]})
    try:
      core = RunCore(exp, cfg, success_threshold(exp), timer=timer, prepared=(session.run_dir, session.number > 0))
      driver = ProgramDriver(exp, parts, cfg, self._learner, self._counter, core, session, timer, times, stop)
      core.open(driver.env_steps, f"{exp.agent} {exp.env} s{exp.seed} distributed/{exp.inference}",
                loggers={"evaluator": metrics_logger(session, "evaluator")})
      timer.start()
      report.watch_compiles(timer)
      final_params = core.drive(driver, signals=False)  # the engine stops its nodes with SIGTERM
      self._finish(core, driver, final_params)
    except Stopped:
      return  # stopped from outside before the end
    finally:
      report.unwatch_compiles()
      timer.stop()
      times.write()
    self._engine.stop()

  def _finish(self, core: RunCore, driver: ProgramDriver, final_params) -> None:
    """The summary (the launcher adds the run report) and the learning curve."""
    exp = self._exp
    server_stats = self._server_stats()
    replay = self._replay.info() if self._replay is not None else None
    batches = sum(s["batches"] for s in server_stats)
    counts = wait_unless_stopped(self._counter.future("get_counts"), self._stop)
    written = core.checkpointed[1]
    details = {
        "inference": exp.inference, "num_actors": exp.num_actors, "engine": self._engine.name,
        "final_checkpoint": os.path.basename(written) if written else None,
        "inference_batch_mean": (sum(s["batch_mean"] * s["batches"] for s in server_stats) / batches
                                 if batches else None),
        "policy_lag_mean": counts.get("policy_lag_sum", 0.0) / max(counts.get("policy_lag_count", 0.0), 1.0),
        "learner_version": int(driver.version),
        **({"replay_size": replay.size, "replay_items_inserted": replay.items_inserted,
            "replay_items_sampled": replay.items_sampled} if replay is not None else {}),
    }
    try:
      core.finish(driver, final_params, core.elapsed(), None, None, kind="distributed",
                  replay=self._replay.kind if self._replay is not None else "reverb",
                  learner_devices=wait_unless_stopped(self._learner.future("mesh_size"), self._stop),
                  learner_processes=exp.num_processes, details=details,
                  plot_title=f"{exp.agent} on {exp.env}, seed {exp.seed} (distributed)")
    except RunWritesFailed:
      pass  # in the summary's failed_writes: the launcher ends non-zero after the run report

  def _server_stats(self) -> List[Dict[str, float]]:
    """Batching statistics of the inference servers that answer in time (a server being
    restarted is left out; a restarted one counts from its restart)."""
    stats = []
    for server_id, server in enumerate(self._servers):
      future = server.future("stats")
      try:
        stats.append(future.result(timeout=min(STATS_TIMEOUT_SECONDS, self._exp.service_deadline_seconds)))
      except Exception as e:  # a missing statistic must not fail the run
        future.cancel()
        log(f"inference server inference/{server_id} gave no stats ({type(e).__name__}: {e}); "
            "left out of inference_batch_mean")
    return stats
