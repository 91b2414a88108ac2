"""Reverb tables, an item writer and an item sampler with the buffer's interface, and a program's
replay client over a Reverb server (`ReverbReplayClient`, a `jrl.replay.service.ReplayClient`).

The only module of the core that imports reverb (and so TensorFlow).
"""

import collections
import os
import shutil
import threading
import time
from typing import Callable, Dict, List, Optional

from jrl import compat

compat.import_reverb()  # rlax and distrax first, and TensorFlow without Keras (see jrl/compat.py)

import numpy as np
import reverb
import tensorflow as tf
import tree

from jrl.errors import Stopped
from jrl.outage import Outage, ServiceLost
from jrl.replay import frames as frame_sharing
from jrl.replay.batches import PrefetchIterator, PreparedBatch, items_per_fetch, make_assembler
from jrl.replay.buffer import SampledItems
from jrl.replay.checkpoint_names import REVERB_REPLAY_DIR
from jrl.replay.service import ReplayInfo, samples_in_flight, table_error_buffer
from jrl.replay.spec import ReplaySpec
from jrl.timing import ASSEMBLE, NULL_TIMER, PLACE, RATE_LIMIT_WAIT, SAMPLE

TABLE = "replay"
# Seconds an insert may wait on the server before we call the server dead or stuck.
INSERT_TIMEOUT_MS = 60_000
# An insert unconfirmed this long asks the server whether it is there, at most this often.
PROBE_AFTER_S = 1.0
PROBE_EVERY_S = 2.0
PROBE_TIMEOUT_S = 1  # whole seconds: reverb's server_info takes an int

tf.config.set_visible_devices([], "GPU")  # TF only moves bytes here; keep GPUs for JAX.


def item_signature(example_item, frame_stack: int = 0) -> object:
  """Table signature of items shaped like `example_item` (a whole item: block or sequence, as
  the learner sees it); with `frame_stack` the frame-sharing layout (`frames.table_item`)."""
  if frame_stack:
    example_item = frame_sharing.table_item(example_item, frame_stack)
  return tree.map_structure(lambda x: tf.TensorSpec(np.shape(x), tf.as_dtype(np.asarray(x).dtype)), example_item)


def replay_tables(spec: ReplaySpec, example_item, updates_per_call: int, batch_size: int, prefetch: int,
                  samplers: int = 1) -> List[reverb.Table]:
  """The Reverb tables of a run, embedded (`jrl.run.embedded`) or distributed (the program's
  replay node): the one table `spec`'s item kind stores in (`make_table`), for items shaped like
  `example_item`, with the error buffer of `table_error_buffer`.

  `samplers` learner processes sample it, each `batch_size` transitions (or sequences) per
  update and the item kind's learner call of `updates_per_call` (the flag's value) updates,
  prepared `prefetch` calls ahead (`prefetched_batches`)."""
  items = items_per_fetch(spec, spec.kind.updates_per_call(updates_per_call), batch_size)
  signature = item_signature(example_item, spec.frame_stack)
  return [make_table(spec, signature, table_error_buffer(items, prefetch, samplers))]


def make_table(spec: ReplaySpec, signature, error_buffer_items: float, name: str = TABLE) -> reverb.Table:
  """The table the spec's item kind stores in: a queue for a kind whose items are each sampled
  once (`ItemKind.sampled_once`: `TrajectoryQueue`), else `rate_limited_table`."""
  if spec.kind.sampled_once:
    return queue_table(spec, signature, name)
  return rate_limited_table(spec, signature, error_buffer_items, name)


def rate_limited_table(spec: ReplaySpec, signature, error_buffer_items: float, name: str = TABLE) -> reverb.Table:
  """A FIFO table of items, uniform or prioritized, limited by a sample/insert ratio.

  Items sampled per item inserted equals transitions sampled per transition
  inserted, so `spec.samples_per_insert` is used as is.
  """
  sampler = (reverb.selectors.Prioritized(spec.priority_exponent) if spec.prioritized
             else reverb.selectors.Uniform())
  error_buffer = max(float(error_buffer_items), 2.0 * max(1.0, spec.samples_per_insert))
  limiter = reverb.rate_limiters.SampleToInsertRatio(
      samples_per_insert=spec.samples_per_insert,
      min_size_to_sample=spec.min_items,
      error_buffer=error_buffer)
  return reverb.Table(name=name, sampler=sampler, remover=reverb.selectors.Fifo(),
                      max_size=spec.max_items, rate_limiter=limiter, signature=signature)


def queue_table(spec: ReplaySpec, signature, name: str = TABLE) -> reverb.Table:
  """A queue whose items are each sampled once, oldest first."""
  return reverb.Table.queue(name=name, max_size=spec.max_items, signature=signature)


def start_server(tables, port: Optional[int] = None, checkpoint_dir: Optional[str] = None,
                 restore_from: Optional[str] = None) -> reverb.Server:
  """An in-process Reverb server; the OS picks the port when `port` is None.

  `checkpoint_dir` is where `Client.checkpoint()` writes; `restore_from` is a
  checkpoint (one of those folders) whose contents the tables start with.
  """
  checkpointer = None
  if checkpoint_dir is not None:
    checkpointer = reverb.checkpointers.DefaultCheckpointer(checkpoint_dir, fallback_checkpoint_path=restore_from)
  return reverb.Server(tables=list(tables), port=port, checkpointer=checkpointer)


def frame_options(spec: ReplaySpec, num_envs: int) -> Dict[str, int]:
  """`ReverbItemWriter`'s frame-sharing arguments for the spec and an actor of `num_envs` envs."""
  if not spec.frame_stack:
    return {}
  return {"frame_stack": spec.frame_stack, "frames_in_flight": spec.frames_in_flight(num_envs)}


class ReverbItemWriter:
  """Writes one item per block of transitions (one append, one create_item).

  It drives Reverb's C++ trajectory writer directly (reverb is pinned): the Python
  wrapper's per-step bookkeeping (path flattening, column histories) took about half
  of each insert's ~200 us, and an item here is always the one step just appended.

  Reverb's writer reconnects to a server that went away and resends what it had
  not confirmed; this class waits that out. An insert unconfirmed for
  PROBE_AFTER_S asks the server for its info: no answer is an outage (logged
  once per interval, ServiceLost after `deadline_s`), an answer means the
  table's rate limiter holds the insert (ServiceLost too once that has lasted
  `deadline_s`: nobody samples). Creating one waits for the server, however
  long, to fetch the table's signature. `timer` gets the waits for insert confirmations (where the
  rate limiter holds inserts) as `rate_limit_wait`.
  """

  def __init__(self, client: reverb.Client, table: str = TABLE, max_in_flight_items: int = 8,
               stop: Optional[threading.Event] = None, deadline_s: float = INSERT_TIMEOUT_MS / 1000,
               log: Callable[[str], None] = print, frame_stack: int = 0, frames_in_flight: int = 0,
               timer=NULL_TIMER):
    self._client = client
    self._timer = timer
    self._frame_stack = frame_stack
    if frame_stack:
      # Frames are steps of column 0, each its own chunk; items reference any of the last
      # `frames_in_flight` (the writer keeps them alive), the item's own columns the step just appended.
      keep = max(1, frames_in_flight)
      self._writer = reverb.trajectory_writer.TrajectoryWriter(client._client.NewTrajectoryWriter(
          reverb.pybind.ConstantChunkerOptions(max_chunk_length=1, num_keep_alive_refs=keep), True))
      self._frame_refs: Dict[int, object] = {}
      self._frame_order: "collections.deque" = collections.deque()
      self._keep = keep
      self._log = log
    else:
      self._writer = client.trajectory_writer(num_keep_alive_refs=1)
    self.items_dropped = 0  # items naming frames from before this writer (see _insert_framed)
    self._columns = self._writer._writer  # the C++ writer behind the wrapper (see the class docstring)
    self._stop = stop
    self._table = table
    self._max_in_flight = max_in_flight_items
    self._deadline_s = deadline_s
    self._outage = Outage(f"replay server {client.server_address}", deadline_s, log)
    self.items_inserted = 0

  def insert(self, block, priority: float) -> None:
    if self._frame_stack:
      if not self._insert_framed(block, priority):
        return
    else:
      # Columns in tree order, as the table's signature; each item column is that one step, squeezed.
      refs = self._columns.Append(tree.flatten(block))
      self._columns.CreateItem(self._table, priority, [[ref] for ref in refs], [True] * len(refs))
    self._flush(self._max_in_flight)
    self.items_inserted += 1

  def add_frames(self, ids: np.ndarray, frames: np.ndarray) -> None:
    """Frames first seen by a frame-sharing adder: a step of column 0 each."""
    for frame_id, frame in zip(ids.tolist(), frames):
      self._frame_refs[frame_id] = self._columns.Append([frame])[0]
      self._frame_order.append(frame_id)
    while len(self._frame_order) > self._keep:  # the writer no longer keeps these alive
      del self._frame_refs[self._frame_order.popleft()]

  def _insert_framed(self, block, priority: float) -> bool:
    """An item in the layout of `frames.table_item`: its frame fields as references to the frame
    steps, in order, then its other fields from one step of their own. An item that names a frame
    this writer never had (a restarted actor's rows in flight when it stopped) is dropped: False;
    more such items than the writer keeps frames alive for means the frames expired instead."""
    frame_columns = []
    for field in frame_sharing.FRAME_FIELDS:
      try:
        frame_columns.append([self._frame_refs[i] for i in np.asarray(getattr(block, field)).ravel().tolist()])
      except KeyError as e:
        self.items_dropped += 1
        if self.items_dropped > self._keep:
          raise RuntimeError(f"{self.items_dropped} items named frames this writer does not hold (frame "
                             f"{e.args[0]}): older than the {self._keep} frames it keeps alive "
                             "(ReplaySpec.frames_in_flight is too small for this item kind)") from e
        if self.items_dropped == 1:
          self._log("replay writer: dropping the items that name frames from before this writer (rows in "
                    "flight when its actor stopped)")
        return False
    rest = block._replace(**{f: () for f in frame_sharing.FRAME_FIELDS})
    refs = self._columns.Append([None] + tree.flatten(rest))[1:]
    self._columns.CreateItem(self._table, priority, frame_columns + [[ref] for ref in refs],
                             [False] * len(frame_columns) + [True] * len(refs))
    return True

  def _flush(self, max_in_flight: int) -> None:
    self._timer.enter(RATE_LIMIT_WAIT)
    try:
      self._wait_for_confirmations(max_in_flight)
    finally:
      self._timer.exit()

  def _wait_for_confirmations(self, max_in_flight: int) -> None:
    """Waits (in short slices, so that a stop request is seen) until at most
    `max_in_flight` items are unconfirmed."""
    stalled_since, next_probe = time.monotonic(), 0.0
    while True:
      try:
        self._writer.flush(max_in_flight, timeout_ms=200)
        self._outage.ok()
        return
      except reverb.errors.DeadlineExceededError as e:
        if self._stop is not None and self._stop.is_set():
          raise Stopped("stop requested while waiting on replay inserts") from e
        now = time.monotonic()
        if now - stalled_since < PROBE_AFTER_S or now < next_probe:
          continue
        next_probe = now + PROBE_EVERY_S
        unreachable = self._probe()
        if unreachable:
          self._outage.failing(unreachable, since=stalled_since)
          continue
        self._outage.ok()
        if now - stalled_since >= self._deadline_s:
          raise ServiceLost(f"{self._outage.service} accepted no insert for {now - stalled_since:.0f}s though it "
                            "answers: its rate limiter holds inserts (is the learner sampling?)") from e

  def _probe(self) -> Optional[str]:
    """None if the server answers, else why not."""
    try:
      self._client.server_info(timeout=PROBE_TIMEOUT_S)
      return None
    except Exception as e:  # any failure to answer counts as unreachable
      return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")

  def flush(self) -> None:
    """Blocks until every created item has reached the server."""
    self._flush(0)

  def close(self) -> None:
    self._writer.end_episode(clear_buffers=True)
    self._writer.close()


class ReverbItemSampler:
  """Samples a fixed number of items per call through a TrajectoryDataset.

  The dataset keeps sample requests in flight on its own threads, which is
  what makes Reverb sampling fast (~10x a Python `client.sample` loop).

  tf.data's autotuning is off: nothing here is tuned by it (fixed batch and
  prefetch), and its model thread sleeps in growing periods (up to a minute)
  that the iterator's destructor waits out: it held processes 20-46 s after
  their last step.
  """

  def __init__(self, server_address: str, num_items: int, structure, table: str = TABLE, frame_stack: int = 0):
    # An example item: samples come back in its pytree structure (with `frame_stack`, from the
    # frame-sharing table's layout).
    self._frame_stack = frame_stack
    self._structure = frame_sharing.table_item(structure, frame_stack) if frame_stack else structure
    dataset = reverb.TrajectoryDataset.from_table_signature(
        server_address=server_address, table=table,
        max_in_flight_samples_per_worker=samples_in_flight(num_items))
    dataset = dataset.batch(num_items, drop_remainder=True).prefetch(1)
    options = tf.data.Options()
    options.autotune.enabled = False
    dataset = dataset.with_options(options)
    self._iterator = dataset.as_numpy_iterator()

  def sample(self) -> SampledItems:
    sample = next(self._iterator)
    data = tree.unflatten_as(self._structure, tree.flatten(sample.data))
    if self._frame_stack:
      data = frame_sharing.from_table(data, self._frame_stack)
    return SampledItems(sample.info.key.astype(np.uint64), sample.info.probability.astype(np.float64),
                        int(sample.info.table_size.max()), data)


def prefetched_batches(address: str, spec: ReplaySpec, example_item, updates_per_call: int, batch_size: int,
                       seed: int, place: Callable, depth: int, stop: Optional[threading.Event] = None,
                       timer=None) -> PrefetchIterator:
  """Learner batches from the Reverb table at `address`, prepared `depth` ahead on a background
  thread: sample the items of one learner call, deal them into batches (shuffled with `seed`),
  `place` them (e.g. sharded on the learner's mesh). `timer`, if given, is that thread's: it
  gets sample (the rate limiter's waits included), assemble, place and queue_wait."""
  sampler = ReverbItemSampler(address, items_per_fetch(spec, updates_per_call, batch_size), example_item,
                              frame_stack=spec.frame_stack)
  assemble_batch = make_assembler(spec, updates_per_call, batch_size, np.random.default_rng(seed))
  clock = timer if timer is not None else NULL_TIMER

  def produce() -> PreparedBatch:
    clock.enter(SAMPLE)
    sampled = sampler.sample()
    clock.switch(ASSEMBLE)
    prepared = assemble_batch(sampled)
    clock.switch(PLACE)
    prepared = prepared._replace(batch=place(prepared.batch))
    clock.exit()
    return prepared

  return PrefetchIterator(produce, depth=depth, stop=stop, timer=timer)


class ReverbReplayClient:
  """A program's replay served by a Reverb server (`jrl.replay.service.ReplayClient`): its actors'
  writers, its learners' batches, priority updates, checkpoints and counts, over `client`."""

  kind = "reverb"  # the summary's `replay`

  def __init__(self, client: reverb.Client):
    self.client = client
    self.address = client.server_address

  def writer(self, spec: ReplaySpec, num_envs: int, stop: threading.Event, deadline_s: float,
             log: Callable[[str], None], timer=NULL_TIMER) -> ReverbItemWriter:
    return ReverbItemWriter(self.client, stop=stop, deadline_s=deadline_s, log=log, timer=timer,
                            **frame_options(spec, num_envs))

  def batches(self, spec: ReplaySpec, example_item, updates_per_call: int, batch_size: int, seed: int,
              place: Callable, depth: int, stop: Optional[threading.Event] = None, timer=None) -> PrefetchIterator:
    return prefetched_batches(self.address, spec, example_item, updates_per_call, batch_size, seed, place, depth,
                              stop=stop, timer=timer)

  def update_priorities(self, priorities: Dict[int, float]) -> None:
    if priorities:
      self.client.mutate_priorities(TABLE, updates=priorities)

  def checkpoint(self, folder: str) -> None:
    """The server writes a checkpoint where it was told to; it is moved into `folder`/reverb."""
    shutil.move(self.client.checkpoint(), os.path.join(folder, REVERB_REPLAY_DIR))

  def info(self) -> ReplayInfo:
    table = self.client.server_info()[TABLE]
    limiter = table.rate_limiter_info
    return ReplayInfo(int(table.current_size), int(limiter.insert_stats.completed),
                      int(limiter.sample_stats.completed))
