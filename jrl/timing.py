"""Where a thread's time goes: phase timers, in the core so that every layer can time itself.

One `PhaseTimer` per thread of work (a node, or the embedded runner's main thread, or its
batch-prefetch thread). It attributes every instant between `start()` and `stop()` to exactly
one phase: the phase on top of its stack. `enter(p)` pushes p (the time so far goes to the
phase below), `exit()` pops it, `switch(p)` replaces the top. Nested phases therefore count
exclusively (the policy's parameter fetch is not also policy time) and the phases of one timer
add up to its wall time by construction; the base phase (`other` by default) gets what no named
phase claims. Each call reads `time.perf_counter` once.

JIT compilation: `watch_compiles(timer)` moves the compile time JAX reports (tracing,
lowering, backend compile; the union of nested events) out of the phase that triggered it into
`compile`. `NodeTimes` is what a timer hands the run report (`jrl.experiment.report`).

Pure Python (no JAX, no numpy): any node of any run can use it.
"""

import collections
import dataclasses
import threading
import time
from typing import Any, Dict, List, Mapping, Optional

# Phases, in report order. Busy phases are work done by the node itself.
ENV = "env"                      # vector env step
POLICY = "policy"                # the policy call (local inference)
INFERENCE_WAIT = "inference_wait"  # waiting on a central inference server
INSERT = "insert"                # adder + block writer + replay insert
RATE_LIMIT_WAIT = "rate_limit_wait"  # inserts held by replay's rate limiter
SAMPLE_WAIT = "sample_wait"      # learner waiting for its next batch (sampling, rate limiter)
SAMPLE = "sample"                # the sampler itself (prefetch thread: Reverb sample, rate limiter included)
ASSEMBLE = "assemble"            # pool and deal sampled items into batches
PLACE = "place"                  # put batches on the learner's devices
UPDATE = "update"                # learner update (jitted call, priorities, metrics)
PARAM_FETCH = "param_fetch"      # parameters from the learner to the actor / server
EVAL = "eval"                    # evaluation episodes
CHECKPOINT = "checkpoint"        # checkpoints and policy snapshots
COMPILE = "compile"              # JAX tracing, lowering and compiling (moved out of the phase that triggered it)
QUEUE_WAIT = "queue_wait"        # a producer blocked on a full queue
COLLECT = "collect"              # an inference server waiting for more actors' requests to fill a batch
REPLY = "reply"                  # an inference server encoding its replies and waking the callers
IDLE = "idle"                    # nothing to do
OTHER = "other"                  # bookkeeping: metrics, logging, the loop itself
DEVICE_LOOP = "device_loop"      # the device backend's compiled chunks: envs, policy, replay and learner in one

PHASES = (ENV, POLICY, INFERENCE_WAIT, INSERT, RATE_LIMIT_WAIT, SAMPLE_WAIT, SAMPLE, ASSEMBLE, PLACE, UPDATE,
          PARAM_FETCH, DEVICE_LOOP, EVAL, CHECKPOINT, COMPILE, COLLECT, REPLY, QUEUE_WAIT, IDLE, OTHER)
WAITING = frozenset({INFERENCE_WAIT, RATE_LIMIT_WAIT, SAMPLE_WAIT, QUEUE_WAIT, COLLECT, IDLE})


class PhaseTimer:
  """Exclusive wall time per phase of one thread (see the module docstring)."""

  __slots__ = ("seconds", "calls", "thread", "_stack", "_since", "_started", "_stopped", "_clock")

  def __init__(self, base: str = OTHER, clock=time.perf_counter):
    self._clock = clock
    self.seconds: Dict[str, float] = collections.defaultdict(float)
    self.calls: Dict[str, int] = collections.defaultdict(int)  # phases ended by switch() or exit()
    self._stack: List[str] = [base]
    self._started: Optional[float] = None
    self._stopped: Optional[float] = None
    self._since = 0.0
    self.thread: Optional[int] = None  # the thread it times (set by start)

  def start(self) -> "PhaseTimer":
    """Starts (or restarts) the books: what was recorded before is dropped."""
    self.seconds.clear()
    self.calls.clear()
    del self._stack[1:]
    self.thread = threading.get_ident()
    self._started = self._since = self._clock()
    self._stopped = None
    return self

  # enter/switch/exit are the hot path (several calls per env step): one clock read and
  # two dict updates each, written out rather than shared through a helper call.
  def enter(self, phase: str) -> None:
    """The time from now on goes to `phase`, until `exit()` or `switch()`."""
    now = self._clock()
    stack = self._stack
    self.seconds[stack[-1]] += now - self._since
    self._since = now
    stack.append(phase)

  def switch(self, phase: str) -> None:
    """Ends the current phase and enters `phase` (one clock read)."""
    now = self._clock()
    stack = self._stack
    done = stack[-1]
    self.seconds[done] += now - self._since
    self._since = now
    self.calls[done] += 1
    stack[-1] = phase

  def exit(self) -> None:
    """Ends the current phase; time goes back to the phase below it."""
    now = self._clock()
    done = self._stack.pop()
    self.seconds[done] += now - self._since
    self._since = now
    self.calls[done] += 1

  def move(self, seconds: float, to: str) -> None:
    """Re-attributes `seconds` of the current phase (still open) to `to`: for time learnt
    after the fact, such as JAX's compilation events."""
    top = self._stack[-1]
    self.seconds[top] = self.seconds.get(top, 0.0) - seconds
    self.seconds[to] = self.seconds.get(to, 0.0) + seconds

  def phase(self, phase: str) -> "_Phase":
    """`with timer.phase("eval"): ...`"""
    return _Phase(self, phase)

  def stop(self) -> None:
    """Closes the books: the open phases get the time up to now."""
    now = self._clock()
    self.seconds[self._stack[-1]] += now - self._since
    self._since = self._stopped = now

  def wall(self) -> float:
    """Seconds from `start()` to `stop()` (or to now, while running)."""
    if self._started is None:
      return 0.0
    return (self._stopped if self._stopped is not None else self._clock()) - self._started

  def totals(self) -> Dict[str, float]:
    """Seconds per phase so far (the open phases counted up to now while running)."""
    out = dict(self.seconds)
    if self._stopped is None and self._started is not None:
      top = self._stack[-1]
      out[top] = out.get(top, 0.0) + self._clock() - self._since
    return {k: v for k, v in out.items() if v != 0.0}

  def node(self, name: str, role: str, helper: bool = False) -> "NodeTimes":
    return NodeTimes(name, role, self.totals(), self.wall(), dict(self.calls), helper)


# JAX's compile events (tracing, lowering, backend compile). Nested jits report nested
# events, so a thread's compile time is the union of their intervals.
# JAX's monitoring events of one compilation: tracing, lowering, and the backend compile.
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
COMPILE_EVENTS = frozenset({"/jax/core/compile/jaxpr_trace_duration",
                            "/jax/core/compile/jaxpr_to_mlir_module_duration", BACKEND_COMPILE_EVENT})
_watched: Dict[int, "_CompileWatch"] = {}
_listening = False


class _CompileWatch:
  """The union of one thread's compile intervals, moved into its timer's `compile` phase."""

  def __init__(self, timer: PhaseTimer):
    self.timer = timer
    self.intervals: List[List[float]] = []  # disjoint [start, end], newest last

  def add(self, end: float, duration: float) -> None:
    start = end - duration
    covered, keep, merged_start = 0.0, [], start
    for lo, hi in self.intervals:
      if hi <= start:
        keep.append([lo, hi])
      else:  # nested in (or overlapping the start of) this event
        covered += min(hi, end) - max(lo, start)
        merged_start = min(merged_start, lo)
    self.intervals = (keep + [[merged_start, end]])[-64:]
    if duration - covered > 0:
      self.timer.move(duration - covered, COMPILE)


def _on_event(event: str, duration: float, **_) -> None:
  watch = _watched.get(threading.get_ident()) if event in COMPILE_EVENTS else None
  if watch is not None:
    watch.add(time.perf_counter(), duration)


def watch_compiles(timer: PhaseTimer) -> None:
  """From now on, JAX compilation in the calling thread goes to `timer`'s `compile` phase
  (out of whichever phase triggered it). Imports jax; `unwatch_compiles()` ends it."""
  global _listening
  if not _listening:
    import jax
    jax.monitoring.register_event_duration_secs_listener(_on_event)
    _listening = True
  _watched[threading.get_ident()] = _CompileWatch(timer)


def unwatch_compiles() -> None:
  _watched.pop(threading.get_ident(), None)


class _Phase:
  __slots__ = ("_timer", "_phase")

  def __init__(self, timer: PhaseTimer, phase: str):
    self._timer, self._phase = timer, phase

  def __enter__(self):
    self._timer.enter(self._phase)

  def __exit__(self, *exc):
    self._timer.exit()
    return False


class NullTimer:
  """A timer that records nothing: the default of the shells, so callers that do not
  time pay one empty method call per phase."""

  __slots__ = ()

  def enter(self, phase: str) -> None:
    pass

  def switch(self, phase: str) -> None:
    pass

  def exit(self) -> None:
    pass

  def phase(self, phase: str) -> "NullTimer":
    return self

  def __enter__(self):
    return None

  def __exit__(self, *exc):
    return False


NULL_TIMER = NullTimer()


@dataclasses.dataclass
class NodeTimes:
  """One node's (or thread's) time: seconds per phase over `wall` seconds."""
  name: str                        # e.g. "main", "prefetch", "actor/0", "learner"
  role: str                        # e.g. "embedded", "sampler", "actor", "learner", "inference", "replay"
  phases: Dict[str, float]
  wall: float
  calls: Dict[str, int] = dataclasses.field(default_factory=dict)
  # A helper thread serves another node (the embedded runner's batch prefetch): shown in the
  # report and used to explain the waits on it, but not a stage of the pipeline itself.
  helper: bool = False

  @property
  def accounted(self) -> float:
    return sum(self.phases.values())

  @property
  def waiting(self) -> float:
    return sum(v for k, v in self.phases.items() if k in WAITING)

  @property
  def busy_share(self) -> float:
    return 1.0 - self.waiting / self.wall if self.wall > 0 else 0.0

  @property
  def steady_busy_share(self) -> float:
    """The busy share with compilation (paid once, at the start) left out of the wall time."""
    wall = self.wall - self.phases.get(COMPILE, 0.0)
    return 1.0 - self.waiting / wall if wall > 0 else 0.0

  def as_dict(self) -> Dict[str, Any]:
    """Plain JSON-able form (to send from a node, or to write next to its logs)."""
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, data: Mapping[str, Any]) -> "NodeTimes":
    return cls(data["name"], data["role"], dict(data["phases"]), float(data["wall"]), dict(data.get("calls", {})),
               bool(data.get("helper", False)))
