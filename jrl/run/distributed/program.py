"""The distributed program: its topology as a Launchpad program, its session, and its report.

  counter (the counts, the run core's books, the budget)   replay (ReverbNode)   learner (variable source)
  actor x N --insert--> replay --sample--> learner
  actor --obs bytes--> inference server x M (inference=server) --params-- learner
  driver (group "evaluator"): the run core's loop (jrl.run.core) over the program:
    evaluates, saves policies, prints progress, has the learner checkpoint, and when the counter
    says the budget is reached writes summary.json and stops the program

The nodes are `jrl.run.distributed.nodes`; launching the program (supervised local_mp, local_mt,
several hosts) is the launchers' (`launch.distributed`, `launch.cluster`).
"""

from jrl import compat

compat.import_jax_probability()  # before anything imports TensorFlow

import collections
import csv
import functools
import glob
import json
import os
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple

import launchpad as lp

from jrl.experiment import report
from jrl.experiment.builder import build_agent_parts
from jrl.experiment.checkpoint import Checkpointer, checkpoint_to_resume
from jrl.experiment.config import ExperimentConfig
from jrl.experiment.files import REPORT_FILE, REVERB_REPLAY_DIR, prepare_run_dir
from jrl.experiment.logging import cut_rows
from jrl.run.distributed import nodes

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
  evaluator: Any                # the driver node (jrl.run.distributed.nodes.DriverNode), in the group "evaluator"

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
