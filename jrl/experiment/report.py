"""Where a run's time goes: phase timers, and the run report that names the bottleneck.

Pure Python (no JAX, no numpy), so that any node of any run can use it.

Timing. One `PhaseTimer` per thread of work (a node, or the embedded runner's main
thread, or its batch-prefetch thread). It attributes every instant between `start()` and
`stop()` to exactly one phase: the phase on top of its stack. `enter(p)` pushes p (the
time so far goes to the phase below), `exit()` pops it, `switch(p)` replaces the top.
Nested phases therefore count exclusively (the policy's parameter fetch is not also
policy time) and the phases of one timer add up to its wall time by construction; the
base phase (`other` by default) gets what no named phase claims. Each call reads
`time.perf_counter` once: about 0.4 us (bench/timer_overhead.py).

JIT compilation: `watch_compiles(timer)` moves the compile time JAX reports (tracing,
lowering, backend compile; the union of nested events) out of the phase that triggered
it into `compile`. The verdict is about the steady state, so it leaves `compile` out
and mentions it when it is large.

Reporting. `build_report(nodes, rates)` takes one `NodeTimes` per node or thread
(name, role, seconds per phase, wall seconds) and the rates the run achieved, and
returns the verdict (`bottleneck`, `advice`) and the `report.md` text. The rule: a
node's *waiting* phases (sample_wait, rate_limit_wait, inference_wait, queue_wait, idle)
are time it was held up by another node. Nodes of one role are summed into a stage; the
stage that waits least (highest busy share, compilation left out) bounds the run, and its
largest phase names the bottleneck: a busy phase names itself (env, policy, replay,
learner, ...), a waiting one names what it waits for (sample_wait: replay,
rate_limit_wait: learner, inference_wait: inference). When even that stage mostly waits,
the largest wait of one stage on another (actors on the server or on the rate limiter)
names it, and if the stage waited on is itself mostly idle, the time goes in round trips.
The embedded runner's main thread is one serial stage, so its largest phase decides;
helper threads (its batch prefetch) are not stages, they explain the waits on them. The
advice adds who waits on the bottleneck and what to change; given the machine's cores,
it says when the nodes keep them all busy.

A distributed run feeds it the same way: each node times its threads with `PhaseTimer`s
(the shells take one: `Actor(timer=)`, `LocalPolicy(timer=)`, `InferenceClient(timer=)`,
`Learner(timer=)`, `PrefetchIterator(timer=)`, `BatchedInference.timer`) and writes
`timer.node(name, role).as_dict()` to the run directory (launch/nodes.py `TimesFile`);
the launcher rebuilds them with `NodeTimes.from_dict` and calls `write_report(run_dir,
nodes, rates, title, extras, cores=)` with one `NodeTimes` per node (several actors share
a role: the verdict sums them into one stage), then merges the returned fields into
summary.json. Extras such as the inference batch-size
histogram (a {size: count} mapping becomes a table) or the policy lag go through `extras`.
"""

import collections
import dataclasses
import threading
import time
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

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

PHASES = (ENV, POLICY, INFERENCE_WAIT, INSERT, RATE_LIMIT_WAIT, SAMPLE_WAIT, SAMPLE, ASSEMBLE, PLACE, UPDATE,
          PARAM_FETCH, EVAL, CHECKPOINT, COMPILE, COLLECT, REPLY, QUEUE_WAIT, IDLE, OTHER)
WAITING = frozenset({INFERENCE_WAIT, RATE_LIMIT_WAIT, SAMPLE_WAIT, QUEUE_WAIT, COLLECT, IDLE})

# What a phase says about the run when it is the largest of the bounding node: the
# `bottleneck` name (a waiting phase names whom it waits for).
BOTTLENECK_OF = {
    ENV: "env", POLICY: "policy", INFERENCE_WAIT: "inference", INSERT: "replay", RATE_LIMIT_WAIT: "learner",
    SAMPLE_WAIT: "replay", SAMPLE: "replay", ASSEMBLE: "replay", PLACE: "replay", UPDATE: "learner",
    PARAM_FETCH: "params", EVAL: "evaluation", CHECKPOINT: "checkpoint", COMPILE: "compile", QUEUE_WAIT: "learner",
    COLLECT: "env", REPLY: "inference", IDLE: "other", OTHER: "other",
}
DOING = {
    ENV: "steps the envs", POLICY: "runs the policy", INFERENCE_WAIT: "waits on the inference server",
    INSERT: "adds transitions to replay", RATE_LIMIT_WAIT: "waits on replay's rate limiter",
    SAMPLE_WAIT: "waits for learner batches", SAMPLE: "samples replay", ASSEMBLE: "assembles batches",
    PLACE: "places batches on the learner's devices", UPDATE: "updates the learner",
    PARAM_FETCH: "fetches parameters", EVAL: "evaluates", CHECKPOINT: "writes checkpoints",
    COMPILE: "compiles JAX programs", COLLECT: "waits for actors' requests to fill a batch",
    REPLY: "encodes replies",
    QUEUE_WAIT: "waits on a full queue", IDLE: "idles", OTHER: "does bookkeeping (metrics, logs, the loop)",
}
CHANGE = {
    "env": "add actors (--distributed --num_actors) or use a faster env; more envs per actor (--num_envs) "
           "only amortise the policy call",
    "policy": "step more envs per policy call (--num_envs), use a smaller network, or batch inference "
              "across actors (--inference server)",
    "inference": "add inference servers (--num_inference_servers) or run the policy in the actors "
                 "(--inference actor)",
    "learner": "raise --updates_per_call, lower samples_per_insert, use a smaller network or add learner "
               "devices (--learner_devices)",
    "replay": "raise --prefetch, block_size or --updates_per_call (fewer, larger samples)",
    "params": "fetch parameters less often (--variable_update_period)",
    "evaluation": "raise --eval_every or lower --eval_episodes",
    "checkpoint": "raise --checkpoint_every_seconds / --checkpoint_every_steps",
    "other": "raise --log_every and --progress_seconds",
}


# A stage's waits on another stage of a distributed pipeline, and the role it waits on.
WAITS_ON = {INFERENCE_WAIT: "inference", RATE_LIMIT_WAIT: "learner"}
ROUND_TRIPS = ("the time goes in round trips between nodes (RPC, wake-ups, a busy machine's scheduling): "
               "make each carry more (--num_envs)")


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
COMPILE_EVENTS = frozenset({"/jax/core/compile/jaxpr_trace_duration",
                            "/jax/core/compile/jaxpr_to_mlir_module_duration",
                            "/jax/core/compile/backend_compile_duration"})
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


@dataclasses.dataclass
class Verdict:
  bottleneck: str      # env, policy, inference, learner, replay, params, evaluation, checkpoint, other
  node: str            # the node (or role) that bounds the run
  phase: str           # its phase that names the bottleneck
  share: float         # that phase's share of the node's wall time
  advice: str          # one line: what bounds the run and what to change


def _sum_by_role(nodes: Sequence[NodeTimes]) -> List[NodeTimes]:
  """Nodes of one role summed (several actors are one stage of the pipeline)."""
  grouped: Dict[str, NodeTimes] = {}
  for node in nodes:
    if node.role not in grouped:
      grouped[node.role] = NodeTimes(node.name, node.role, {}, 0.0, {}, node.helper)
    else:
      grouped[node.role].name = node.role
    group = grouped[node.role]
    group.wall += node.wall
    for k, v in node.phases.items():
      group.phases[k] = group.phases.get(k, 0.0) + v
    for k, v in node.calls.items():
      group.calls[k] = group.calls.get(k, 0) + v
  return list(grouped.values())


def _largest(phases: Mapping[str, float]) -> str:
  return max(phases, key=phases.get) if phases else OTHER


def busy_cores(nodes: Sequence[NodeTimes]) -> float:
  """Cores' worth of work the nodes did: their busy (not waiting) seconds, helpers and
  compilation included, per second of the longest node's wall time. Above the machine's
  cores, nodes were also busy waiting for a core (wall time counts a descheduled thread)."""
  wall = max((n.wall for n in nodes), default=0.0)
  return sum(n.accounted - n.waiting for n in nodes) / wall if wall > 0 else 0.0


def verdict(nodes: Sequence[NodeTimes], cores: Optional[int] = None) -> Verdict:
  """The stage that bounds the run and what bounds it (see the module docstring).

  Nodes of one role are one stage; the stage busiest in its steady state (compilation left
  out) bounds the run. An inference server's own work (decoding, the policy, replies) names
  `inference`. With `cores` (the machine's), a run whose nodes keep about all of them busy
  says so: then no placement adds throughput on this machine.
  """
  groups = [g for g in _sum_by_role(nodes) if g.wall > 0]
  stages = [g for g in groups if not g.helper] or groups
  if not stages:
    return Verdict("other", "-", OTHER, 0.0, "no time was recorded")
  bound = max(stages, key=lambda s: s.steady_busy_share)
  # Compilation is paid once: the verdict is about the run's steady state, compile is a note.
  phase = _largest({k: v for k, v in bound.phases.items() if k != COMPILE})
  share = bound.phases.get(phase, 0.0) / bound.wall
  if phase in WAITING:
    # No stage is mostly busy: the largest wait of one stage on another names the bottleneck.
    waits = [(g, k, v / g.wall) for g in stages for k, v in g.phases.items() if k in WAITS_ON]
    if waits and max(w for _, _, w in waits) > share:
      bound, phase, share = max(waits, key=lambda t: t[2])
  name = BOTTLENECK_OF.get(phase, phase)
  if bound.role == "inference" and phase not in WAITING and name in ("policy", "params", "other"):
    name = "inference"
  advice = f"{name}-bound: {share:.0%} of {bound.name} time {DOING.get(phase, 'in ' + phase)}"
  # What the stage it waits for does, or who waits on it.
  waited_on = [g for g in groups if g.role == WAITS_ON.get(phase)]
  round_trips = bool(waited_on) and waited_on[0].steady_busy_share < 0.5
  if round_trips:
    g = waited_on[0]
    advice += f"; yet {g.name} itself waits {1 - g.steady_busy_share:.0%} of its time: {ROUND_TRIPS}"
    advice += ", or run the policy in the actors (--inference actor)" if name == "inference" else ""
  elif phase in WAITING:
    served = [g for g in groups if g is not bound and BOTTLENECK_OF.get(_largest(g.phases)) == name]
    if served:
      g = served[0]
      top = _largest({k: v for k, v in g.phases.items() if k not in WAITING} or g.phases)
      advice += f" ({g.name} {DOING.get(top, top)} {g.phases.get(top, 0.0) / g.wall:.0%} of its time)"
  else:
    waiting = [(g, k, v / g.wall) for g in groups if g is not bound for k, v in g.phases.items()
               if k in WAITING and BOTTLENECK_OF.get(k) == name and v > 0]
    if waiting:
      g, k, w = max(waiting, key=lambda t: t[2])
      advice += f"; {g.name} {DOING[k]} {w:.0%} of its time"
  advice += f"; {CHANGE[name]}" if name in CHANGE and not round_trips else ""
  compiled = bound.phases.get(COMPILE, 0.0) / bound.wall
  if compiled >= 0.1:
    advice += f" (JIT compilation took another {compiled:.0%}, once; a longer run amortises it)"
  if cores:
    used = busy_cores(nodes)
    if used >= 0.9 * cores:
      kept = (f"the nodes kept {used:.1f} cores busy on a {cores}-core machine" if used <= cores else
              f"the nodes' busy time adds up to {used:.1f} cores on a {cores}-core machine (waits for a core "
              "count as busy)")
      advice += f"; {kept}: it is saturated, so more actors or servers will not add throughput here"
  return Verdict(name, bound.name, phase, share, advice)


def _fmt_rate(value: Optional[float]) -> str:
  if value is None:
    return "-"
  return f"{value:,.1f}" if abs(value) < 100 else f"{value:,.0f}"


def report_markdown(nodes: Sequence[NodeTimes], rates: Mapping[str, Any], result: Verdict,
                    title: str = "Run report", extras: Optional[Mapping[str, Any]] = None) -> str:
  """The text of report.md: verdict, rates, and seconds per phase for every node."""
  lines = [f"# {title}", "", f"**bottleneck: {result.bottleneck}** ({result.node}, phase `{result.phase}`, "
           f"{result.share:.0%} of its time)", "", result.advice, "", "## Rates", "", "| rate | value |", "|---|---|"]
  for key, value in rates.items():
    lines.append(f"| {key} | {_fmt_rate(value) if isinstance(value, (int, float)) or value is None else value} |")
  for node in nodes:
    lines += ["", f"## {node.name} ({node.role}): {node.wall:.2f} s wall", "",
              "| phase | seconds | share | calls | ms per call |", "|---|---:|---:|---:|---:|"]
    ordered = [p for p in PHASES if p in node.phases] + sorted(p for p in node.phases if p not in PHASES)
    for phase in ordered:
      seconds = node.phases[phase]
      calls = node.calls.get(phase, 0)
      per_call = f"{1000 * seconds / calls:.3f}" if calls else "-"
      mark = " (waiting)" if phase in WAITING else ""
      lines.append(f"| {phase}{mark} | {seconds:.3f} | {seconds / node.wall:.1%} | {calls or '-'} | {per_call} |"
                   if node.wall > 0 else f"| {phase} | {seconds:.3f} | - | {calls or '-'} | {per_call} |")
    gap = node.wall - node.accounted
    lines.append(f"| **sum of phases** | {node.accounted:.3f} | "
                 f"{node.accounted / node.wall if node.wall else 0:.1%} | | unaccounted {gap:+.3f} s |")
  for key, value in (extras or {}).items():
    lines += ["", f"## {key}", ""]
    if isinstance(value, Mapping):
      lines += ["| value | count |", "|---|---:|"] + [f"| {k} | {v} |" for k, v in value.items()]
    else:
      lines.append(str(value))
  lines.append("")
  return "\n".join(lines)


def summary_fields(nodes: Sequence[NodeTimes], rates: Mapping[str, Any], result: Verdict) -> Dict[str, Any]:
  """The keys a run adds to summary.json: the verdict, rates, and seconds per phase by node."""
  return {
      "bottleneck": result.bottleneck,
      "bottleneck_node": result.node,
      "bottleneck_advice": result.advice,
      **{k: (round(v, 4) if isinstance(v, float) else v) for k, v in rates.items()},
      "phase_seconds": {n.name: {k: round(v, 4) for k, v in n.phases.items()} for n in nodes},
      "phase_wall_seconds": {n.name: round(n.wall, 4) for n in nodes},
  }


def build_report(nodes: Sequence[NodeTimes], rates: Mapping[str, Any], title: str = "Run report",
                 extras: Optional[Mapping[str, Any]] = None, cores: Optional[int] = None):
  """(verdict, report.md text, summary.json fields) in one call."""
  result = verdict(nodes, cores)
  return result, report_markdown(nodes, rates, result, title, extras), summary_fields(nodes, rates, result)


def write_report(run_dir: str, nodes: Sequence[NodeTimes], rates: Mapping[str, Any], title: str = "Run report",
                 extras: Optional[Mapping[str, Any]] = None, file_name: str = "report.md",
                 cores: Optional[int] = None):
  """Writes RUN_DIR/report.md (atomically); returns (verdict, summary.json fields)."""
  import os
  from jrl.experiment.files import write_bytes_atomic
  result, text, fields = build_report(nodes, rates, title, extras, cores)
  write_bytes_atomic(os.path.join(run_dir, file_name), text.encode())
  return result, fields


def phases_add_up(node: NodeTimes, tolerance: float = 0.05) -> bool:
  """True when the node's phases account for its wall time within `tolerance`."""
  return node.wall > 0 and abs(node.accounted - node.wall) <= tolerance * node.wall


def merge(nodes: Iterable[NodeTimes], name: str, role: str, helper: bool = False) -> NodeTimes:
  """One node from several (e.g. the sessions of a resumed run, the incarnations of a
  restarted node): phases and walls summed."""
  out = NodeTimes(name, role, {}, 0.0, {}, helper)
  for node in nodes:
    out.wall += node.wall
    for k, v in node.phases.items():
      out.phases[k] = out.phases.get(k, 0.0) + v
    for k, v in node.calls.items():
      out.calls[k] = out.calls.get(k, 0) + v
  return out
