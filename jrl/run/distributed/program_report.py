"""A distributed run's report, whichever engine ran its nodes: read from the phase times every node
wrote (`node_io.TimesFile`) and the summary its driver node wrote."""

import collections
import glob
import json
import os
from typing import Any, Dict, List, Mapping, Optional

from jrl.experiment import report
from jrl.experiment.builder import build_agent_parts
from jrl.experiment.config import ExperimentConfig
from jrl.experiment.files import REPORT_FILE
from jrl.run.distributed.node_io import Session, times_folder

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


def read_node_books(run_dir: str, session_number: int) -> List[Dict[str, Any]]:
  """What the nodes of this session wrote with `node_io.TimesFile` (one dict per incarnation)."""
  books = []
  for path in sorted(glob.glob(os.path.join(times_folder(run_dir, session_number), "*.json"))):
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


def run_report(run_dir: str, session: Session, exp: ExperimentConfig, agent_cfg, summary: Dict[str, Any],
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
