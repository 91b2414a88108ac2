"""Where a run's time goes: the run report that names the bottleneck.

Pure Python (no JAX, no numpy), so that any node of any run can use it.

Timing: `jrl.timing` (the core) holds the phase timer, the phase names and `NodeTimes`: import
them from there. The verdict is about the steady state, so it leaves `compile` out and mentions
it when it is large.

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
`timer.node(name, role).as_dict()` to the run directory (jrl/run/distributed/node_io.py `TimesFile`);
the launcher rebuilds them with `NodeTimes.from_dict` and calls `write_report(run_dir,
nodes, rates, title, extras, cores=)` with one `NodeTimes` per node (several actors share
a role: the verdict sums them into one stage), then merges the returned fields into
summary.json. Extras such as the inference batch-size
histogram (a {size: count} mapping becomes a table) or the policy lag go through `extras`.

Every run names the devices of its roles (summary.json `details["devices"]`: role -> device
names, `device_name`); `devices_text` makes them the report's one-line `devices` extra.
"""

import dataclasses
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

from jrl import timing
from jrl.timing import (ASSEMBLE, CHECKPOINT, COLLECT, COMPILE, DEVICE_LOOP, ENV, EVAL, IDLE, INFERENCE_WAIT, INSERT,
                        OTHER, PARAM_FETCH, PHASES, PLACE, POLICY, QUEUE_WAIT, RATE_LIMIT_WAIT, REPLY, SAMPLE,
                        SAMPLE_WAIT, UPDATE, WAITING, NodeTimes)

# The timer's names this module once re-exported (`report.PhaseTimer`): they answer still, as the
# jrl.timing objects themselves, for code written against the old path; import them from jrl.timing.
TIMING_ALIASES = ("COMPILE_EVENTS", "NULL_TIMER", "NullTimer", "PhaseTimer", "_CompileWatch", "unwatch_compiles",
                  "watch_compiles")


def __getattr__(name: str) -> Any:
  if name in TIMING_ALIASES:
    return getattr(timing, name)
  raise AttributeError(f"module '{__name__}' has no attribute '{name}'")

# What a phase says about the run when it is the largest of the bounding node: the
# `bottleneck` name (a waiting phase names whom it waits for).
BOTTLENECK_OF = {
    ENV: "env", POLICY: "policy", INFERENCE_WAIT: "inference", INSERT: "replay", RATE_LIMIT_WAIT: "learner",
    SAMPLE_WAIT: "replay", SAMPLE: "replay", ASSEMBLE: "replay", PLACE: "replay", UPDATE: "learner",
    PARAM_FETCH: "params", EVAL: "evaluation", CHECKPOINT: "checkpoint", COMPILE: "compile", QUEUE_WAIT: "learner",
    COLLECT: "env", REPLY: "inference", IDLE: "other", OTHER: "other", DEVICE_LOOP: "device loop",
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
    DEVICE_LOOP: "runs the compiled loop (envs, policy, replay and learner on the device)",
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
    "device loop": "the loop is the run, as intended; for more env steps per second step more envs at once "
                   "(--num_envs) or add devices (--learner_devices)",
}


# A stage's waits on another stage of a distributed pipeline, and the role it waits on.
WAITS_ON = {INFERENCE_WAIT: "inference", RATE_LIMIT_WAIT: "learner"}
ROUND_TRIPS = ("the time goes in round trips between nodes (RPC, wake-ups, a busy machine's scheduling): "
               "make each carry more (--num_envs)")




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


# The extras key of a run's devices (its summary's details["devices"], as `devices_text` writes them).
DEVICES = "devices"


def device_name(device: Any) -> str:
  """A JAX device as a run's summary names it: '<platform>:<id>' ('cpu:0', 'cuda:0'), a GPU by its
  platform as `jrl.accelerators` names it ('cuda' or 'rocm', from its client's platform version).
  Read off the device's attributes: this module imports no JAX."""
  platform = device.platform
  if platform == "gpu":
    version = str(getattr(getattr(device, "client", None), "platform_version", "")).lower()
    platform = "rocm" if "rocm" in version else "cuda"
  return f"{platform}:{device.id}"


def devices_text(devices: Mapping[str, Sequence[str]], notes: Optional[Mapping[str, str]] = None) -> str:
  """One line naming each role's devices, e.g. 'learner: cpu:0; actor: cpu:0 (--actor_device auto)'
  (`notes`: role -> what to add in brackets). A role whose processes all run on one kind of device
  says so once: 'actor: cpu x8'."""
  parts = []
  for role, names in devices.items():
    names = list(names)
    text = f"{names[0]} x{len(names)}" if len(names) > 1 and len(set(names)) == 1 else ", ".join(names)
    note = (notes or {}).get(role)
    parts.append(f"{role}: {text}" + (f" ({note})" if note else ""))
  return "; ".join(parts)


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
  """The keys a run adds to summary.json (jrl.experiment.summary): the verdict, the rates, and
  seconds per phase by node."""
  return {
      "bottleneck": result.bottleneck,
      "bottleneck_node": result.node,
      "bottleneck_advice": result.advice,
      "rates": {k: (round(v, 4) if isinstance(v, float) else v) for k, v in rates.items()},
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
