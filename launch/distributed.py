"""The distributed topology as a Launchpad program, and how to run it.

  counter (the counts, the run core's books, the budget)   replay (ReverbNode)   learner (variable source)
  actor x N --insert--> replay --sample--> learner
  actor --obs bytes--> inference server x M (inference=server) --params-- learner
  driver (group "evaluator"): the run core's loop (jrl.experiment.run_core) over the program:
    evaluates, saves policies, prints progress, has the learner checkpoint, and when the counter
    says the budget is reached writes summary.json and stops the program

Under local_mp each node is a process of launch/supervisor.py: actors, the driver
and inference servers are restarted when they fail (up to max_restarts each),
any other failure stops the program; servers listen on JRL_BIND_ADDRESS
(127.0.0.1 by default, launch/loopback.py).
"""

from jrl import compat

compat.import_jax_probability()  # before anything imports TensorFlow

import collections
import csv
import dataclasses
import functools
import glob
import json
import os
import sys
import threading
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple

import launchpad as lp

from jrl import accelerators
from jrl.errors import ConfigError
from jrl.experiment import report
from jrl.experiment.builder import build_agent_parts
from jrl.experiment.checkpoint import Checkpointer, checkpoint_to_resume
from jrl.experiment.config import ExperimentConfig
from jrl.experiment.checkpoint import RunWritesFailed
from jrl.experiment.files import REPORT_FILE, REVERB_REPLAY_DIR, SUMMARY_FILE, prepare_run_dir, resolve_paths
from jrl.experiment.logging import cut_rows
from jrl.experiment.run_core import add_to_summary
from jrl.experiment.summary import with_report
from launch import cluster, liveness, loopback, multihost, nodes, supervisor

# Nodes that hold no state others depend on: restarted when they fail (the driver node keeps its
# books in the counter).
RESTARTABLE_GROUPS = ("actor", "evaluator", "inference")
REPORT_NOTES = (
    "Times are this session's, per node, each from its start (after its set-up) to its end; a "
    "restarted node's incarnations are summed. Each node's phases add up to its wall time. "
    "Actors: `policy` (the local policy, or encoding and decoding for a server), `inference_wait` "
    "(the RPC to the inference server), `env`, `insert` (adder, block writer, replay writes), "
    "`rate_limit_wait` (waiting for Reverb to confirm inserts: its rate limiter holds them when "
    "the learner samples too little), `param_fetch`. Learner: `sample_wait` (its next batch), "
    "`update`; `prefetch` samples and prepares batches in its own thread; `publish` is the time RPC "
    "threads spent copying new parameters to hand out. Inference servers: `idle` (no request), "
    "`collect` (waiting for more actors to fill the batch), `policy` (decoding and the jitted "
    "call), `reply`. The evaluator runs beside the pipeline (nobody waits on it). JIT "
    "compilation is its own phase and the verdict leaves it out. The stage (all nodes of one role) "
    "busiest in its steady state bounds the run. Rates: env-steps/s are the actors' own (steps "
    "over their wall time, summed), `run_env_steps_per_second` the whole run's including start-up; "
    "samples_per_insert counts Reverb items once replay holds min_replay_size.")
ROLE_ORDER = ("learner", "sampler", "publisher", "actor", "inference", "evaluator")


class ProgramNodes(NamedTuple):
  """The handles of a program's nodes, for nodes of your own to call (Courier RPC):
  `learner.get_variables()` -> (params as numpy, version); `counter.get_counts()` -> the run's
  counts (actor_steps, learner_steps, episodes, wall_seconds, ...); `replay` is the Reverb node."""
  counter: Any
  replay: Any
  learners: List[Any]           # one per learner process; learners[0] serves the parameters
  inference_servers: List[Any]  # empty unless inference=server
  actors: List[Any]
  evaluator: Any                # the driver node (launch.nodes.DriverNode), in the group "evaluator"

  @property
  def learner(self) -> Any:
    return self.learners[0]


def build_program(exp: ExperimentConfig, agent_cfg, session: nodes.Session,
                  counter_state: Optional[Dict[str, Any]] = None) -> Tuple[lp.Program, ProgramNodes]:
  """The topology and its nodes' handles; a resumed session starts the counter, learner and
  replay from its checkpoint."""
  replay_restore = (os.path.join(session.checkpoint, "replay", REVERB_REPLAY_DIR) if session.checkpoint else None)
  program = lp.Program("jrl")
  with program.group("counter"):
    counter = program.add_node(lp.CourierNode(nodes.Counter, counter_state, exp.steps))
  with program.group("replay"):
    replay = program.add_node(lp.ReverbNode(functools.partial(nodes.make_replay_tables, exp, agent_cfg),
                                            functools.partial(nodes.reverb_checkpointer, session.run_dir,
                                                              replay_restore)))
  with program.group("learner"):
    learners = [program.add_node(lp.CourierNode(nodes.LearnerNode, exp, agent_cfg, replay, counter, session, i))
                for i in range(exp.num_processes)]
  learner = learners[0]  # serves the parameters
  servers = []
  if exp.inference == "server":
    with program.group("inference"):
      for server_id in range(exp.num_inference_servers):
        assigned = len(range(server_id, exp.num_actors, exp.num_inference_servers))
        servers.append(program.add_node(lp.CourierNode(nodes.InferenceNode, exp, agent_cfg, learner, assigned,
                                                       server_id, counter, session)))
  actors = []
  with program.group("actor"):
    for actor_id in range(exp.num_actors):
      server = servers[actor_id % len(servers)] if servers else None
      actors.append(program.add_node(lp.CourierNode(nodes.ActorNode, actor_id, exp, agent_cfg, replay, learner,
                                                    counter, server, session)))
  with program.group("evaluator"):  # the driver node keeps the group's name (logs, pids, restarts)
    evaluator = program.add_node(lp.CourierNode(nodes.DriverNode, exp, agent_cfg, learner, counter, servers,
                                                session, replay))
  return program, ProgramNodes(counter, replay, learners, servers, actors, evaluator)


def prepare_session(exp: ExperimentConfig, agent_cfg) -> Tuple[nodes.Session, Optional[Dict[str, Any]]]:
  """The run directory of a new run (created, config.json written), or the checkpoint a
  resumed one continues from (its metrics cut back to it); ConfigError for bad input."""
  if not exp.resume:
    run_dir = os.path.abspath(prepare_run_dir(exp, agent_cfg))
    os.makedirs(os.path.join(run_dir, "logs"), exist_ok=True)
    return nodes.Session(run_dir), None
  run_dir = os.path.abspath(exp.resume)
  info = checkpoint_to_resume(run_dir, exp.steps, exp.resume_strict)
  if info is None:
    return nodes.Session(run_dir), None
  saved = Checkpointer.read_run_state(info)
  Checkpointer(run_dir).clean_partial()
  cut_metrics_to_checkpoint(run_dir, saved)
  return nodes.Session(run_dir, saved.get("sessions", 0) + 1, info.path), saved["counter"]


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
  path = os.path.join(run_dir, "metrics", "restarts.csv")
  counts: Dict[str, int] = {}
  if os.path.exists(path):
    with open(path, newline="") as f:
      for row in csv.DictReader(f):
        counts[row["node"]] = counts.get(row["node"], 0) + 1
  return counts


def read_node_books(run_dir: str, session_number: int) -> List[Dict[str, Any]]:
  """What the nodes of this session wrote with `nodes.TimesFile` (one dict per incarnation)."""
  books = []
  for path in sorted(glob.glob(os.path.join(nodes.times_folder(run_dir, session_number), "*.json"))):
    try:
      with open(path) as f:
        books.append(json.load(f))
    except (OSError, ValueError):  # written atomically; a file that cannot be read is left out
      continue
  return books


def _histogram(books: List[Mapping[str, Any]], key: str) -> Dict[int, int]:
  out: Dict[int, int] = collections.Counter()
  for book in books:
    for value, count in book.get(key, {}).items():
      out[int(value)] += int(count)
  return dict(sorted(out.items()))


def _mean(histogram: Mapping[int, int]) -> Optional[float]:
  total = sum(histogram.values())
  return sum(k * v for k, v in histogram.items()) / total if total else None


def report_inputs(books: List[Mapping[str, Any]], summary: Mapping[str, Any], spec):
  """(nodes, rates, extras) of the run report from the nodes' books and summary.json (pure).

  Several incarnations of one node are summed into one `NodeTimes`. env-steps/s are each
  actor's steps over its own wall time, summed over actors; updates/s the lead learner's."""
  by_name: Dict[str, List[report.NodeTimes]] = collections.defaultdict(list)
  steps: Dict[str, List[float]] = collections.defaultdict(lambda: [0.0, 0.0])
  for book in books:
    times = [report.NodeTimes.from_dict(n) for n in book.get("nodes", [])]
    for t in times:
      by_name[t.name].append(t)
    if times:
      main = times[0]
      for key in ("env_steps", "updates", "calls"):
        if key in book:
          steps[f"{key}:{main.name}"][0] += float(book[key])
          steps[f"{key}:{main.name}"][1] += main.wall
  merged = [ts[0] if len(ts) == 1 else report.merge(ts, name, ts[0].role, ts[0].helper)
            for name, ts in by_name.items()]
  order = {role: i for i, role in enumerate(ROLE_ORDER)}
  merged.sort(key=lambda n: (order.get(n.role, len(order)), n.name))

  def rate(key: str, lead_only: bool = False) -> Optional[float]:
    pairs = [(v, w) for k, (v, w) in steps.items() if k.startswith(f"{key}:")
             and (not lead_only or k == f"{key}:learner/0")]
    return sum(v / w for v, w in pairs if w > 0) if pairs else None

  details = summary["details"]
  inserted, sampled = details.get("replay_items_inserted"), details.get("replay_items_sampled")
  spi = None
  if inserted is not None and sampled is not None:
    counted = spec.kind.counted_inserts(0, inserted, spec.min_items)
    spi = sampled / counted if counted > 0 else None
  batch_sizes, lags = _histogram(books, "batch_sizes"), _histogram(books, "policy_lag")
  wall = summary.get("wall_seconds") or 0.0
  rates = {
      "env_steps_per_second": rate("env_steps"),
      "updates_per_second": rate("updates", lead_only=True),
      "learner_calls_per_second": rate("calls", lead_only=True),
      "samples_per_insert": spi,
      "samples_per_insert_target": spec.kind.samples_per_insert(spec),
      "run_env_steps_per_second": summary.get("actor_steps", 0) / wall if wall else None,
      "inference_batch_mean": _mean(batch_sizes),
      "policy_lag_mean": _mean(lags),
      "busy_cores": report.busy_cores(merged),
  }
  extras = {}
  if batch_sizes:
    extras["inference batch sizes (requests per batch: batches)"] = batch_sizes
  if lags:
    extras["policy lag (learner calls between the parameters an actor acts with and the learner's, "
           "once a second per actor: samples)"] = lags
  extras["notes"] = REPORT_NOTES
  return merged, rates, extras


def run_report(run_dir: str, session: nodes.Session, exp: ExperimentConfig, agent_cfg, summary: Dict[str, Any],
               cores: Optional[int], **details: Any):
  """Writes RUN_DIR/report.md from the nodes' books; (verdict, the report's fields, `details` with
  the report's own added), for `run_core.add_to_summary`. `details["devices"]` (each role's
  processes' devices, `jrl.accelerators.describe`) is the report's devices line too."""
  spec = build_agent_parts(exp.agent, exp.env, agent_cfg).replay_spec
  node_times, rates, extras = report_inputs(read_node_books(run_dir, session.number), summary, spec)
  if details.get("devices"):
    extras = {report.DEVICES: report.devices_text(details["devices"]), **extras}
  title = f"{exp.agent} on {exp.env}, seed {exp.seed}, distributed ({exp.num_actors} actors, " \
          f"inference {exp.inference}): where the time went"
  result, fields = report.write_report(run_dir, node_times, rates, title, extras, REPORT_FILE, cores)
  batch_sizes = extras.get("inference batch sizes (requests per batch: batches)")
  if batch_sizes:
    details["inference_batch_sizes"] = {str(k): v for k, v in batch_sizes.items()}
  return result, fields, details


def write_run_report(run_dir: str, session: nodes.Session, exp: ExperimentConfig, agent_cfg,
                     summary: Dict[str, Any], cores: Optional[int], **details: Any):
  """Writes RUN_DIR/report.md from the nodes' books; (verdict, `summary` with the report's verdict,
  rates and phase seconds, and `details` added: not written)."""
  result, fields, details = run_report(run_dir, session, exp, agent_cfg, summary, cores, **details)
  return result, with_report(summary, fields, **details)


class ProgramStopped(KeyboardInterrupt):
  """The program was stopped from outside (Ctrl-C, SIGTERM, lp.stop) before its driver node ended
  the run. `signum`: the signal the launcher got (None: not known, launchers other than local_mp)."""

  def __init__(self, run_dir: str, signum: Optional[int] = None):
    super().__init__(run_dir)
    self.run_dir, self.signum = run_dir, signum


STOP_CHECKPOINT_SECONDS = 60.0  # the most a stop from outside waits for the learner's checkpoint


def checkpoint_before_stop(built: "BuiltProgram") -> None:
  """At Ctrl-C or SIGTERM to the launcher (local_mp), before the nodes are stopped: the lead
  learner writes a checkpoint (learner, counters, replay), as the periodic ones, waited for at most
  STOP_CHECKPOINT_SECONDS. Not when the run has ended (its driver node wrote the summary after the
  final checkpoint and stopped the program)."""
  if os.path.exists(os.path.join(built.run_dir, SUMMARY_FILE)):
    return
  print(f"[launcher] stopping: the learner writes a checkpoint first (at most {STOP_CHECKPOINT_SECONDS:.0f} s; "
        "the same signal again stops at once)", flush=True)
  written = []
  call = threading.Thread(target=lambda: written.append(built.nodes.learner.dereference().checkpoint()),
                          name="checkpoint-before-stop", daemon=True)
  call.start()
  call.join(STOP_CHECKPOINT_SECONDS)
  if not written:
    raise TimeoutError(f"the learner wrote no checkpoint within {STOP_CHECKPOINT_SECONDS:.0f} s")
  path, failed_policy = written[0]
  print(f"[launcher] checkpoint {os.path.relpath(path, built.run_dir)} written; stopping the program", flush=True)
  if failed_policy is not None:
    print(f"[checkpoint] {failed_policy}", file=sys.stderr, flush=True)


@dataclasses.dataclass
class BuiltProgram:
  """A distributed run ready to launch: its Launchpad program (add nodes of your own to it), the
  handles of jrl's nodes, and what `launch_program` needs to run it as `launch.train
  --distributed` does."""
  program: lp.Program
  nodes: ProgramNodes
  exp: ExperimentConfig
  agent_cfg: Any
  session: nodes.Session
  placement: Optional[Any]                # launch.placement.Placement; None for a launch on this host
  node_env: Dict[str, str]                # added to each node's environment (local_mp)
  # role -> its processes' devices and environments (jrl.accelerators.place_roles; local_mp on this host)
  roles: Optional[Mapping[str, Any]] = None

  @property
  def node_envs(self) -> Dict[str, Dict[str, str]]:
    """node name ("learner/0") -> what its role's placement adds to its environment."""
    return {f"{role}/{p.index}": dict(p.env) for role, processes in (self.roles or {}).items() for p in processes}

  @property
  def run_dir(self) -> str:
    return self.session.run_dir


def make_program(exp: ExperimentConfig, agent_cfg) -> BuiltProgram:
  """The Launchpad program `launch.train --distributed` runs for `exp` (a new run directory is
  created and its config written; `exp.resume` continues one). ConfigError for bad input,
  before anything is written or launched.

  Launch it with `launch_program` (jrl's launchers: supervised local_mp with restarts,
  local_mt, --launcher slurm / template; the run report), or with Launchpad's own
  `lp.launch(built.program, launch_type="local_mp")` (no restarts, no report)."""
  exp = resolve_paths(exp)
  build_agent_parts(exp.agent, exp.env, agent_cfg)  # config errors surface here, before any process starts
  if exp.inference == "server" and exp.num_inference_servers > exp.num_actors:
    raise ConfigError("num_inference_servers", f"must be <= num_actors ({exp.num_actors})")
  placement = cluster.resolve_placement(exp) if exp.launcher != "local" else None
  node_env = loopback.node_env(loopback.bind_address()) if exp.launcher == "local" and exp.lp_launch_type == "local_mp" else {}
  roles = place_on_this_host(exp) if exp.launcher == "local" and exp.lp_launch_type == "local_mp" else None
  session, counter_state = prepare_session(exp, agent_cfg)
  if exp.num_processes > 1 and not exp.coordinator_address:
    host = placement.host_of("learner", 0).address if placement else "127.0.0.1"
    exp = dataclasses.replace(exp, coordinator_address=f"{host}:{multihost.pick_port()}")
  program, handles = build_program(exp, agent_cfg, session, counter_state)
  return BuiltProgram(program, handles, exp, agent_cfg, session, placement, node_env, roles)


def place_on_this_host(exp: ExperimentConfig) -> Dict[str, Any]:
  """Each role's devices and environment on this host (jrl.accelerators): the learner and inference
  servers on its GPUs, the rest on the CPU; nothing changes on a host without GPUs. ConfigError
  (before anything is written): more --learner_devices than the host's GPUs, JAX_PLATFORMS asking
  for a GPU JAX does not see."""
  servers = exp.num_inference_servers if exp.inference == "server" else 0
  return accelerators.place_roles(accelerators.host_accelerators(), exp.learner_devices, servers, exp.num_actors,
                                  learners=exp.num_processes, jax_platforms=os.environ.get("JAX_PLATFORMS", ""))


def run_distributed(exp: ExperimentConfig, agent_cfg) -> Dict[str, Any]:
  """Launches the program (this host, or placed on several) and waits for it; RuntimeError naming
  the node that failed."""
  return launch_program(make_program(exp, agent_cfg))


def launch_program(built: BuiltProgram) -> Dict[str, Any]:
  """Launches a built program with jrl's launcher for its experiment (`exp.launcher`,
  `exp.lp_launch_type`), waits for it, writes the run report; the run's summary. RuntimeError
  naming the node that failed; RunWritesFailed (after the report) when a checkpoint or policy
  snapshot was not written."""
  program, exp, agent_cfg, session = built.program, built.exp, built.agent_cfg, built.session
  placement, node_env = built.placement, built.node_env
  run_dir, log_dir = session.run_dir, os.path.join(session.run_dir, "logs")
  policy = supervisor.RestartPolicy(RESTARTABLE_GROUPS, exp.max_restarts, exp.restart_backoff_seconds)
  echo = cluster.ProgressEcho(os.path.join(log_dir, "evaluator", "0"))
  lost: Dict[str, Any] = {}
  if placement is not None:
    echo.start()
    try:
      lost = cluster.launch_on_hosts(exp, program, run_dir, placement, dataclasses.asdict(policy))
    finally:
      echo.stop()
  elif exp.lp_launch_type == "local_mp":
    manager = supervisor.launch(program, run_dir, policy, node_env, built.node_envs)
    echo.start()
    try:
      manager.before_stop = functools.partial(checkpoint_before_stop, built)
      manager.wait()  # until every process has ended; raises NodeFailure (a RuntimeError) with the report
    finally:
      echo.stop()
  else:
    lp.launch(program, launch_type=lp.LaunchType.LOCAL_MULTI_THREADING, serialize_py_nodes=False).wait()
  summary_path = os.path.join(run_dir, SUMMARY_FILE)
  if not os.path.exists(summary_path):  # no node failed (that raises above): stopped from outside (Ctrl-C)
    raise ProgramStopped(run_dir, manager.stop_signal if exp.lp_launch_type == "local_mp" and placement is None
                         else None)
  with open(summary_path) as f:
    summary = json.load(f)
  restarts = restart_counts(run_dir)
  # One machine's cores are the budget of a local launch; hosts of a cluster each have theirs.
  result, fields, details = run_report(run_dir, session, exp, agent_cfg, summary,
                                       os.cpu_count() if placement is None else None, restarts=restarts,
                                       restarts_total=sum(restarts.values()), lost_hosts=sorted(lost),
                                       lost_nodes=liveness.lost_nodes(lost),
                                       **({"devices": accelerators.describe(built.roles)} if built.roles else {}))
  summary = add_to_summary(run_dir, fields, **details)
  print(f"report: {result.advice} ({os.path.join(run_dir, REPORT_FILE)})", flush=True)
  if summary["failed_writes"]:  # the driver node recorded them; the run is whole but for them
    raise RunWritesFailed(run_dir, summary["failed_writes"])
  summary["run_dir"] = run_dir
  return summary
