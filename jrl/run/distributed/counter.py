"""The program's counter node: the counts every node adds to, the run core's books the driver keeps,
and the word on the step budget."""

import threading
from typing import Any, Dict, Optional


def report_share(budget: float, counted: float, num_actors: int) -> float:
  """How many unreported env steps an actor may hold before it reports them, beside its once a
  second: its share of what the budget has left (`counted`: the total the counter last told it).

  Actors learn the total only when they report, so without it each could run a whole second past
  the budget. With it, when the budget is passed no actor holds more than its share of what was
  left at its last report, and every actor that sees the budget passed stops: together they end
  below budget * (2 - 1/num_actors) + num_actors vector steps, and near the budget when they step
  at like speeds. No actor is waited for, so a lost one does not hold the run."""
  return max(budget - counted, 0.0) / num_actors


class Counter:
  """The program's shared bookkeeping: counts summed with `increment` (env steps,
  episodes, learner steps, wall seconds, ...), the run core's books (`RunBooks.state()`: the
  evaluation history, the next evaluation, the newest one) that the driver node keeps, and the
  budget: `over()` is the one place that says the run's env steps are spent, for the actors (they
  stop acting) and the driver node (it concludes the run and stops the program). It outlives
  every restartable node and goes into checkpoints (`snapshot`)."""

  def __init__(self, initial: Optional[Dict[str, Any]] = None, steps: Optional[float] = None):
    """`initial`: a checkpoint's `snapshot()` (one written before the books were kept here has
    the evaluation history alone); `steps`: the budget of env steps (None: none)."""
    self._lock = threading.Lock()
    self._counts: Dict[str, float] = dict((initial or {}).get("counts", {}))
    self._eval_history: Optional[Dict[str, Any]] = (initial or {}).get("eval_history")
    self._books: Optional[Dict[str, Any]] = (initial or {}).get("books")
    self._steps = steps

  def increment(self, **deltas) -> Dict[str, float]:
    with self._lock:
      for key, value in deltas.items():
        self._counts[key] = self._counts.get(key, 0.0) + float(value)
      return dict(self._counts)

  def get_counts(self) -> Dict[str, float]:
    with self._lock:
      return dict(self._counts)

  def over(self) -> bool:
    """Whether the env steps counted have reached the budget."""
    with self._lock:
      return self._steps is not None and self._counts.get("actor_steps", 0.0) >= self._steps

  def set_books(self, books: Dict[str, Any]) -> None:
    with self._lock:
      self._books, self._eval_history = books, books["history"]

  def get_books(self) -> Optional[Dict[str, Any]]:
    with self._lock:
      return self._books

  def set_eval_history(self, state: Dict[str, Any]) -> None:
    with self._lock:
      self._eval_history = state

  def get_eval_history(self) -> Optional[Dict[str, Any]]:
    with self._lock:
      return self._eval_history

  def snapshot(self) -> Dict[str, Any]:
    with self._lock:
      return {"counts": dict(self._counts), "eval_history": self._eval_history, "books": self._books}
