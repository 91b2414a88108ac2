"""Checkpoints of a run: learner state (orbax), run state and replay contents.

Layout of one checkpoint, `RUN_DIR/checkpoints/ckpt-<index>/` (format 2):

  learner/         the learner's training state, orbax StandardCheckpointer
  run_state.json   counters, evaluation history, actor/adder/policy state, RNGs, the metric logs'
  run_state.npz    positions: data only, the tree in the .json and its arrays in the .npz
  replay/          replay contents: the seeded buffer's (seeded_buffer.json and .npz, data as the
                   run state), or Reverb's own checkpoint
  manifest.json    the format, size and sha256 of every file above, and the counters

The run state and the seeded buffer are data (`jrl.experiment.checkpoint_formats`: arrays and plain
values, readable with json and numpy alone), with one exception: gymnasium envs have no
state-as-data API, so the actor keeps its envs as the bytes of their pickle (a uint8 array in the
.npz; None for envs that refuse it). That is the only pickle left, and only of the envs themselves.
`read_run_state` and `read_replay_state` read by the manifest's format: format 2 as written, and
format 1 (run_state.pkl and replay/seeded_buffer.pkl, pickles of live objects) through the one
converter, `checkpoint_formats.from_format_1`; a resumed format-1 run writes format 2 from then on.

A checkpoint is written into `checkpoints/.staging-<index>/` and renamed into
place once complete (a directory rename is atomic), so a kill at any instant
leaves the previous checkpoints intact and no torn one under a `ckpt-` name.
Old checkpoints are first renamed away, then deleted, for the same reason.
Restoring verifies the manifest, so a damaged checkpoint is named, not loaded. A resume whose
newest checkpoints are damaged (a disk that filled, a copy cut short) continues from the newest
intact one and sets the damaged ones aside in `checkpoints/damaged/`, where they are neither picked
again nor pruned; `--resume_strict` refuses instead (`checkpoint_to_resume`).
"""

import contextlib
import hashlib
import os
import re
import shutil
import sys
import time
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Tuple

from jrl.errors import ConfigError
from jrl.experiment import checkpoint_formats
from jrl.experiment.files import CHECKPOINTS_DIR, fsync_dir, read_json, write_json

FORMAT = 2  # what `save` writes
READS = (1, 2)  # the formats a checkpoint may have to be resumed (`verify`)
_NAME = re.compile(r"^ckpt-(\d+)$")
MANIFEST = "manifest.json"
RUN_STATE = "run_state"  # run_state.json and .npz (format 1: run_state.pkl)
LEARNER = "learner"
REPLAY = "replay"
DAMAGED = "damaged"  # under checkpoints/: damaged checkpoints a resume set aside


class CheckpointInfo(NamedTuple):
  path: str
  index: int
  manifest: Dict[str, Any]


class DamagedCheckpoint(ConfigError):
  """A checkpoint whose files do not match its manifest, or whose manifest cannot be read;
  `manifest` is None in that case."""

  def __init__(self, path: str, damage: str, manifest: Optional[Dict[str, Any]] = None):
    super().__init__("resume", f"checkpoint {_shown(path)} is damaged: {damage}")
    self.path, self.damage, self.manifest = path, damage, manifest

  @property
  def actor_steps(self) -> Optional[float]:
    return self.manifest["counters"].get("actor_steps", 0) if self.manifest else None


def _shown(path: str) -> str:
  """A path for a message: from the working directory when it is below it, else absolute."""
  relative = os.path.relpath(path)
  return os.path.abspath(path) if relative.startswith("..") else relative


def _sha256(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      digest.update(chunk)
  return digest.hexdigest()


def _files_under(root: str) -> List[str]:
  found = []
  for directory, _, names in os.walk(root):
    for name in names:
      found.append(os.path.relpath(os.path.join(directory, name), root))
  return sorted(found)


def _local_checkpointer():
  """orbax for this process's own files: the state is saved as host arrays (one replica),
  and no other process takes part (each process of a multi-process learner holds the
  same replicated state; orbax's cross-process finalisation is not wanted here)."""
  import jax
  import orbax.checkpoint as ocp  # ~3 s to import: only runs that checkpoint pay it
  me = jax.process_index()
  return ocp.StandardCheckpointer(
      multiprocessing_options=ocp.options.MultiprocessingOptions(primary_host=me, active_processes={me}))


def _host_copy(tree: Any) -> Any:
  """numpy copies of the first local replica of every leaf."""
  import jax
  import numpy as np
  first_replica = lambda x: x.addressable_shards[0].data if isinstance(x, jax.Array) else x
  return jax.tree_util.tree_map(lambda x: np.asarray(jax.device_get(first_replica(x))), tree)


class WriteFailed(Exception):
  """A checkpoint or policy snapshot that could not be written; `what` names it."""

  def __init__(self, what: str, cause: BaseException):
    super().__init__(f"{what}: {one_line(cause)}")
    self.what = what


def one_line(error: BaseException) -> str:
  """An exception as one line: its class and the first line of its message."""
  text = str(error).strip().splitlines()
  return f"{error.__class__.__name__}: {text[0]}" if text else error.__class__.__name__


def failed_line(what: str, error: BaseException) -> str:
  """The line that records a write that failed: `what` (or the `WriteFailed`'s own) and its error."""
  return f"{error.what if isinstance(error, WriteFailed) else what} was not written ({one_line(error.__cause__ or error)})"


class FailedWrites:
  """The checkpoints and policy snapshots a run could not write (a full disk, a folder it may
  not write). Each failure is printed in one line and recorded, and the run goes on: a finished
  run still writes its summary, plot and report, then ends non-zero (`RunWritesFailed`)."""

  def __init__(self):
    self.lines: List[str] = []

  @contextlib.contextmanager
  def attempt(self, what: str) -> Iterator[None]:
    try:
      yield
    except Exception as e:  # noqa: BLE001 - any failure to write is reported, never fatal to the run
      self.record(failed_line(what, e))

  def record(self, line: str) -> None:
    """Records a failed write's line (`failed_line`, made where the write failed) and prints it."""
    self.lines.append(line)
    print(f"[checkpoint] {line}", file=sys.stderr, flush=True)

  def check(self, run_dir: str) -> None:
    """RunWritesFailed when any write failed (call once the run's summary is written)."""
    if self.lines:
      raise RunWritesFailed(run_dir, self.lines)


class RunWritesFailed(RuntimeError):
  """A run that trained to its end, wrote its summary and report, but lost some checkpoints or
  policy snapshots; the message names the first."""

  def __init__(self, run_dir: str, lines: List[str]):
    more = f" (and {len(lines) - 1} more failed writes)" if len(lines) > 1 else ""
    super().__init__(f"the run finished and wrote its summary in {run_dir}, but {lines[0]}{more}")
    self.run_dir, self.lines = run_dir, list(lines)


class Checkpointer:
  """Writes, lists, verifies and restores the checkpoints of one run directory."""

  def __init__(self, run_dir: str, keep: int = 3):
    # Absolute: orbax refuses relative paths.
    self.root = os.path.join(os.path.abspath(run_dir), CHECKPOINTS_DIR)
    self._keep = keep

  def _indices(self) -> List[int]:
    if not os.path.isdir(self.root):
      return []
    return sorted(int(m.group(1)) for m in map(_NAME.match, os.listdir(self.root)) if m)

  def _path(self, index: int) -> str:
    return os.path.join(self.root, f"ckpt-{index:06d}")

  def save(self, learner_state: Any, run_state: Dict[str, Any], counters: Dict[str, Any],
           write_replay: Optional[Callable[[str], None]] = None) -> str:
    """Writes one checkpoint and prunes old ones; returns its path.

    `write_replay(folder)` stores the replay contents in `folder`; `counters`
    (env steps, learner steps, ...) go into the manifest for people and checks.
    """
    index = self.next_index()
    final = self._path(index)
    staging = os.path.join(self.root, f".staging-{index:06d}")
    try:
      self._write(staging, index, learner_state, run_state, counters, write_replay)
      os.rename(staging, final)
      fsync_dir(self.root)
    except Exception as e:
      shutil.rmtree(staging, ignore_errors=True)
      raise WriteFailed(f"checkpoint {final}", e) from e
    self._prune()
    return final

  def next_index(self) -> int:
    indices = self._indices()
    return indices[-1] + 1 if indices else 1

  def _write(self, staging: str, index: int, learner_state: Any, run_state: Dict[str, Any],
             counters: Dict[str, Any], write_replay: Optional[Callable[[str], None]]) -> None:
    os.makedirs(self.root, exist_ok=True)
    if os.path.exists(staging):
      shutil.rmtree(staging)
    os.makedirs(staging)
    start = time.monotonic()
    if learner_state is not None:
      checkpointer = _local_checkpointer()
      try:
        checkpointer.save(os.path.join(staging, LEARNER), _host_copy(learner_state))
        checkpointer.wait_until_finished()
      finally:
        checkpointer.close()
    checkpoint_formats.write(staging, RUN_STATE, run_state)
    if write_replay is not None:
      os.makedirs(os.path.join(staging, REPLAY))
      write_replay(os.path.join(staging, REPLAY))
    files = {}
    for rel in _files_under(staging):
      full = os.path.join(staging, rel)
      with open(full, "rb+") as f:
        os.fsync(f.fileno())
      files[rel] = {"size": os.path.getsize(full), "sha256": _sha256(full)}
    write_json(os.path.join(staging, MANIFEST), {
        "format": FORMAT, "index": index, "counters": dict(counters), "created": time.time(),
        "write_seconds": round(time.monotonic() - start, 4), "files": files})

  def _prune(self) -> None:
    for index in self._indices()[:-self._keep]:
      doomed = os.path.join(self.root, f".deleting-{index:06d}")
      os.rename(self._path(index), doomed)
      shutil.rmtree(doomed, ignore_errors=True)

  def clean_partial(self) -> None:
    """Removes what a killed writer or pruner left (never a committed checkpoint)."""
    if not os.path.isdir(self.root):
      return
    for name in os.listdir(self.root):
      if name.startswith((".staging-", ".deleting-")):
        shutil.rmtree(os.path.join(self.root, name), ignore_errors=True)

  def all(self) -> List[str]:
    return [self._path(i) for i in self._indices()]

  def latest(self) -> Optional[CheckpointInfo]:
    """The newest checkpoint, verified; None if the run has none."""
    indices = self._indices()
    if not indices:
      return None
    return self.verify(self._path(indices[-1]))

  def newest_intact(self) -> Tuple[Optional[CheckpointInfo], List[DamagedCheckpoint]]:
    """The newest checkpoint that verifies (None if none does), and the damaged ones newer than
    it, newest first."""
    damaged = []
    for index in reversed(self._indices()):
      try:
        return self.verify(self._path(index)), damaged
      except DamagedCheckpoint as e:
        damaged.append(e)
    return None, damaged

  def set_aside(self, path: str) -> str:
    """Moves a damaged checkpoint into `checkpoints/damaged/` (kept for a person to look at; no
    longer a `ckpt-` of this folder, so never resumed from or pruned); returns its new path. A
    checkpoint already gone (another process of the run set it aside) is left as it is."""
    folder = os.path.join(self.root, DAMAGED)
    os.makedirs(folder, exist_ok=True)
    target, copy = os.path.join(folder, os.path.basename(path)), 0
    while os.path.exists(target):  # its index was used again after an earlier damage
      copy += 1
      target = os.path.join(folder, f"{os.path.basename(path)}.{copy}")
    try:
      os.rename(path, target)
    except FileNotFoundError:
      return target
    fsync_dir(self.root)
    return target

  def verify(self, path: str) -> CheckpointInfo:
    """Checks every file against the manifest; ConfigError('resume', ...) naming the damage."""
    name = _shown(path)
    manifest_path = os.path.join(path, MANIFEST)
    try:
      manifest = read_json(manifest_path)
      if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise ValueError("not a manifest")
    except (OSError, ValueError) as e:
      raise DamagedCheckpoint(path, f"unreadable {MANIFEST} ({e.__class__.__name__})") from None
    if manifest.get("format") not in READS:
      raise ConfigError("resume", f"checkpoint {name} has format {manifest.get('format')}, this jrl reads formats "
                                  f"{' and '.join(map(str, READS))}")
    for rel, expected in manifest["files"].items():
      full = os.path.join(path, rel)
      if not os.path.isfile(full):
        raise DamagedCheckpoint(path, f"{rel} is missing", manifest)
      size = os.path.getsize(full)
      if size != expected["size"]:
        raise DamagedCheckpoint(path, f"{rel} has {size} bytes, {expected['size']} were written (truncated?)", manifest)
      if _sha256(full) != expected["sha256"]:
        raise DamagedCheckpoint(path, f"{rel} does not match its checksum", manifest)
    return CheckpointInfo(path, int(manifest["index"]), manifest)

  @staticmethod
  def restore_learner(info: CheckpointInfo, template: Any) -> Any:
    """The learner state as host (numpy) arrays, with the structure, shapes and dtypes of `template`."""
    checkpointer = _local_checkpointer()
    try:
      return checkpointer.restore(os.path.join(info.path, LEARNER), _host_copy(template))
    finally:
      checkpointer.close()

  @staticmethod
  def read_run_state(info: CheckpointInfo) -> Dict[str, Any]:
    """The run state, as data (`checkpoint_formats`), from a checkpoint of any format `verify` accepts."""
    return _read(info, info.path, RUN_STATE)

  @staticmethod
  def read_replay_state(info: CheckpointInfo, name: str) -> Any:
    """The replay contents a run saved as data under `name` in replay/ (the seeded buffer's)."""
    return _read(info, os.path.join(info.path, REPLAY), name)

  @staticmethod
  def replay_dir(info: CheckpointInfo) -> str:
    return os.path.join(info.path, REPLAY)


def _read(info: CheckpointInfo, folder: str, name: str) -> Any:
  """The data saved as `name` in `folder` of checkpoint `info`, by its format: 2 as written; 1 (NAME.pkl)
  through the converter."""
  if info.manifest["format"] == 1:
    return checkpoint_formats.from_format_1(os.path.join(folder, f"{name}.pkl"))
  return checkpoint_formats.read(folder, name)


def describe_latest(run_dir: str) -> Optional[str]:
  """'PATH (N env steps)' of the run's newest intact checkpoint (the one a resume continues
  from); None when it has none."""
  try:
    info, _ = Checkpointer(run_dir).newest_intact()
  except ConfigError:  # a checkpoint of another format
    return None
  return f"{info.path} ({info.manifest['counters'].get('actor_steps', 0):.0f} env steps)" if info else None


def _in_run(path: str, run_dir: str) -> str:
  """`path` as people find it from the run directory: checkpoints/ckpt-000004."""
  return os.path.relpath(path, os.path.abspath(run_dir))


def checkpoint_to_resume(run_dir: str, steps: int, strict: bool = False) -> Optional[CheckpointInfo]:
  """The newest intact checkpoint of a run being resumed, verified; None when it has none yet (the
  run starts over). ConfigError if it already has `steps` env steps.

  Newer checkpoints that are damaged are set aside (`Checkpointer.set_aside`) and named in one
  line on stderr with the env steps they held beyond the one resumed from; with `strict`
  (--resume_strict), or when no checkpoint is intact, the damage is a ConfigError instead and
  nothing is moved. Prints the checkpoint and env steps the run continues from."""
  checkpointer = Checkpointer(run_dir)
  info, damaged = checkpointer.newest_intact()
  if info is None and not damaged:
    print(f"[resume] {run_dir} has no checkpoint yet: the run starts over", flush=True)
    return None
  if damaged and info is None:
    raise ConfigError("resume", f"{damaged[0].problem}, and the run has no intact checkpoint before it")
  done = info.manifest["counters"].get("actor_steps", 0)
  where = f"{_in_run(info.path, run_dir)} at {done:.0f} env steps"
  if damaged and strict:
    raise ConfigError("resume", f"{damaged[0].problem}; without --resume_strict the run continues from {where}")
  if done >= steps:
    raise ConfigError("steps", f"the run already has {done:.0f} env steps; raise --steps above that to extend it")
  if damaged:
    for damage in damaged:
      try:
        checkpointer.set_aside(damage.path)
      except OSError as e:  # a folder the run may not change: resuming would meet the damage again
        raise ConfigError("resume", f"{damage.problem}, and it cannot be set aside ({one_line(e)})") from None
    newest = damaged[0].actor_steps
    lost = f"{newest - done:.0f} env steps lost" if newest is not None else "the env steps it held are lost"
    names = "; ".join(f"{_in_run(d.path, run_dir)} is damaged: {d.damage}" for d in damaged)
    print(f"[resume] {names}; set aside in {_in_run(os.path.join(checkpointer.root, DAMAGED), run_dir)}/, "
          f"continuing from {where}: {lost} (--resume_strict refuses instead)", file=sys.stderr, flush=True)
  print(f"[resume] continuing from {where}", flush=True)
  return info


class CheckpointSchedule:
  """When to checkpoint: every `every_steps` env steps and every `every_seconds` of wall time
  (0 disables either)."""

  def __init__(self, every_steps: int, every_seconds: float, steps: int = 0):
    self._every_steps, self._every_seconds = every_steps, every_seconds
    self._next_steps = (steps // every_steps + 1) * every_steps if every_steps else None
    self._last_time = time.monotonic()

  @property
  def next_steps(self) -> Optional[int]:
    """The env steps at which a checkpoint falls due by steps (None: not by steps)."""
    return self._next_steps

  def due(self, steps: int) -> bool:
    by_steps = self._next_steps is not None and steps >= self._next_steps
    by_time = self._every_seconds > 0 and time.monotonic() - self._last_time >= self._every_seconds
    return by_steps or by_time

  def done(self, steps: int) -> None:
    if self._every_steps:
      self._next_steps = (steps // self._every_steps + 1) * self._every_steps
    self._last_time = time.monotonic()
