"""Checkpoint format 2: the run state (and the seeded replay) as data, readable with json and numpy
alone, the envs' pickle the only opaque entry; one versioned reader, whose format-1 converter turns
the live objects of old pickles into the data the current classes restore from; an unknown format
is one line naming it."""

import glob
import io
import json
import os
import pickle
import shutil
import subprocess
import sys
from typing import Any, Dict, List, NamedTuple

import numpy as np
import pytest

from jrl.agents import dqn
from jrl.errors import ConfigError
from jrl.experiment import checkpoint_formats
from jrl.experiment.checkpoint import FORMAT, Checkpointer
from jrl.experiment.config import ExperimentConfig
from jrl.replay.adders import NStepTransitionAdder
from jrl.replay.frames import FrameStore
from jrl.replay.sequence_adder import START_STATE_KEY, OverlappingSequenceAdder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data")

# Reads a format-2 file pair with json and numpy alone (jrl cannot be imported) and prints what it
# found: the key paths of byte strings, the array count, and the tree with arrays as their dtype and shape.
PLAIN_READER = r"""
import json, sys
sys.modules["jrl"] = None  # any import of jrl fails
import numpy as np
folder, name = sys.argv[1:]
tree = json.load(open(f"{folder}/{name}.json"))
arrays = np.load(f"{folder}/{name}.npz", allow_pickle=False)
found = {"bytes": [], "arrays": 0}
def walk(node):
  if isinstance(node, dict) and "__bytes__" in node:
    found["bytes"].append(node["__bytes__"])
    return "bytes:%d" % arrays[node["__bytes__"]].size
  if isinstance(node, dict) and "__array__" in node:
    found["arrays"] += 1
    a = arrays[node["__array__"]]
    return "%s%s" % (a.dtype, list(a.shape))
  if isinstance(node, dict):
    return {k: walk(v) for k, v in node.items()}
  if isinstance(node, list):
    return [walk(v) for v in node]
  return node
found["tree"] = walk(tree)
print(json.dumps(found))
"""


def read_plainly(folder: str, name: str) -> Dict[str, Any]:
  out = subprocess.run([sys.executable, "-c", PLAIN_READER, folder, name], capture_output=True, text=True,
                       timeout=120, cwd="/")
  assert out.returncode == 0, out.stderr[-2000:]
  return json.loads(out.stdout)


def same(a: Any, b: Any, path: str = "") -> List[str]:
  """Where two data trees differ (types, dtypes and bytes of arrays included); [] when equal."""
  if isinstance(a, dict) and isinstance(b, dict):
    if list(a) != list(b):
      return [f"{path}: keys {list(a)} != {list(b)}"]
    return [d for k in a for d in same(a[k], b[k], f"{path}/{k}")]
  if isinstance(a, list) and isinstance(b, list):
    if len(a) != len(b):
      return [f"{path}: {len(a)} != {len(b)} entries"]
    return [d for i, (x, y) in enumerate(zip(a, b)) for d in same(x, y, f"{path}/{i}")]
  if isinstance(a, (np.ndarray, np.generic)) or isinstance(b, (np.ndarray, np.generic)):
    ok = (type(a) is type(b) and a.dtype == b.dtype and np.shape(a) == np.shape(b)
          and np.asarray(a).tobytes() == np.asarray(b).tobytes())
    return [] if ok else [f"{path}: {type(a).__name__} {getattr(a, 'dtype', '')} != {type(b).__name__} "
                          f"{getattr(b, 'dtype', '')}, or other bytes"]
  ok = type(a) is type(b) and (a == b or (isinstance(a, float) and np.isnan(a) and np.isnan(b)))
  return [] if ok else [f"{path}: {a!r} != {b!r}"]


def no_pickle_files(checkpoint: str) -> None:
  names = [os.path.relpath(p, checkpoint) for p in glob.glob(os.path.join(checkpoint, "**", "*"), recursive=True)]
  assert not [n for n in names if n.endswith(".pkl")], names


# Format 2 as runs write it.

def test_an_embedded_run_checkpoints_data_that_json_and_numpy_read_and_resumes_to_the_same_bytes(tmp_path):
  from jrl.experiment.resume import resumed_configs
  from jrl.run.embedded import run
  cfg = dqn.Config(min_replay_size=256, hidden_sizes=(16,), n_step=3)
  exp = lambda name, steps: ExperimentConfig(seed=0, steps=steps, deterministic=True, eval_every=1_000,
                                             eval_episodes=1, progress_seconds=0, checkpoint_every_steps=500,
                                             run_dir=str(tmp_path / name))
  straight = run(exp("straight", 1_500), cfg)
  run(exp("stopped", 1_000), cfg)
  info = Checkpointer(str(tmp_path / "stopped")).latest()
  assert info.manifest["format"] == FORMAT == 2
  assert {"run_state.json", "run_state.npz", "replay/seeded_buffer.json", "replay/seeded_buffer.npz"} <= \
      set(info.manifest["files"])
  no_pickle_files(info.path)

  plain = read_plainly(info.path, "run_state")
  assert plain["bytes"] == ["/actor/envs"]  # the one opaque entry: the envs' own pickle
  actor = plain["tree"]["actor"]
  assert actor["envs"].startswith("bytes:") and actor["obs"] == "float32[8, 4]" and actor["env_steps"] == 1_000
  adder = actor["adder"]  # the n-step windows as arrays: steps held, observations, actions, rewards
  assert adder == {"count": "int64[8]", "obs": "float32[3, 8, 4]", "act": "int32[3, 8]", "rew": "float32[3, 8]"}
  assert set(actor["policy"]) == {"key", "env_steps"}  # the policy's ActorState, by its fields
  assert plain["tree"]["learner_steps"] > 0 and plain["tree"]["loop"]["history"]["actor_steps"] == [1_000]
  replay = read_plainly(os.path.join(info.path, "replay"), "seeded_buffer")
  buffer = replay["tree"]["buffer"]
  assert replay["bytes"] == [] and buffer["_rng"]["bit_generator"] == "PCG64"
  assert set(buffer["_storage"]) == {"observation", "action", "reward", "discount", "next_observation"}
  assert isinstance(buffer["_rng"]["state"]["state"], int) and buffer["_rng"]["state"]["state"] > 2 ** 64

  # jrl's reader gives the same tree, arrays in place; the envs' bytes unpickle to gymnasium envs.
  saved = Checkpointer.read_run_state(info)
  assert pickle.loads(saved["actor"]["envs"])[0].spec.id == "CartPole-v1"
  assert isinstance(saved["actor"]["tracker"], list) and len(saved["actor"]["tracker"]) == 2  # a tuple, as a list

  resumed_exp, resumed_cfg = resumed_configs(str(tmp_path / "stopped"), {"steps": 1_500, "progress_seconds": 0.0}, {})
  resumed = run(resumed_exp, resumed_cfg)
  assert resumed["resumed"] and resumed["actor_steps"] == straight["actor_steps"]
  assert resumed["params_digest"] == straight["params_digest"]


@pytest.mark.needs_gymnax
def test_a_device_runs_checkpoint_is_data_too(tmp_path):
  from jrl.agents import ppo
  from jrl.run.device.runner import run_device
  exp = ExperimentConfig(agent="ppo", env="gymnax:CartPole-v1", backend="device", seed=0, steps=4_096,
                         eval_every=2_048, eval_episodes=1, progress_seconds=0, checkpoint_every_steps=2_048,
                         run_dir=str(tmp_path / "run"))
  run_device(exp, ppo.Config())
  info = Checkpointer(str(tmp_path / "run")).latest()
  assert info.manifest["format"] == 2 and not os.path.exists(os.path.join(info.path, "replay"))
  no_pickle_files(info.path)
  plain = read_plainly(info.path, "run_state")
  saved = Checkpointer.read_run_state(info)
  assert plain["bytes"] == [] and plain["arrays"] == len(saved["carry"]) > 10  # the loop's carry, leaf by leaf
  assert plain["tree"]["host"]["env_steps"] == 4_096 and isinstance(plain["tree"]["host"]["row_mark"], list)
  assert all(isinstance(leaf, np.ndarray) for leaf in saved["carry"])


# Format 1, through the converter.

def _old(run: str) -> Dict[str, Any]:
  (path,) = glob.glob(os.path.join(DATA, run, "checkpoints", "ckpt-*"))
  return Checkpointer(os.path.join(DATA, run)).verify(path)


class _OldPaths(pickle.Unpickler):
  """The old objects, unpickled with today's classes: PPO's clipping adder was pickled under
  jrl.experiment.builder, which re-exported it then (the converter finds it by name)."""

  def find_class(self, module: str, name: str):
    if (module, name) == ("jrl.experiment.builder", "RewardClipAdder"):
      module = "jrl.replay.adders"
    return super().find_class(module, name)


@pytest.mark.parametrize("run", ["at_18d3c4a/dqn", "pre_item_kinds/r2d2", "pre_item_kinds/ppo"])
def test_the_converter_turns_a_format_1_run_state_into_what_the_current_classes_restore_from(run):
  """Everything but the adder as it was pickled (tuples as lists, NamedTuples as their fields); the
  adder (pickled apart, PPO's clipping one under the module that re-exported it) as its class's
  `state()` of the unpickled object, array for array; the seeded buffer's RNG as its state."""
  info = _old(run)
  assert info.manifest["format"] == 1
  converted = Checkpointer.read_run_state(info)
  with open(os.path.join(info.path, "run_state.pkl"), "rb") as f:
    old = pickle.load(f)  # the old classes still unpickle it
  old_adder = _OldPaths(io.BytesIO(old["actor"].pop("adder"))).load()
  assert same(converted["actor"].pop("adder"), checkpoint_formats.as_data(old_adder.state())) == []
  assert same(converted, checkpoint_formats.as_data(old)) == []

  replay = Checkpointer.read_replay_state(info, "seeded_buffer")
  with open(os.path.join(info.path, "replay", "seeded_buffer.pkl"), "rb") as f:
    old_replay = pickle.load(f)
  assert replay["buffer"]["_rng"] == old_replay["buffer"]["_rng"].bit_generator.state
  assert same(replay["buffer"]["_storage"], checkpoint_formats.as_data(old_replay["buffer"]["_storage"])) == []
  assert replay["buffer"]["_frames"] is None and replay["assembler_rng"] == old_replay["assembler_rng"]


def _round_trip(tree: Any, folder: str) -> Any:
  checkpoint_formats.write(folder, "state", tree)
  return checkpoint_formats.read(folder, "state")


def test_adders_restored_from_converted_format_1_data_add_what_the_old_objects_add(tmp_path):
  """The n-step adder of a DQN run and the overlapping-sequence adder of an R2D2 run, converted,
  written as format 2 and read back, then fed the same steps as the unpickled old objects."""
  rng = np.random.default_rng(0)
  for run, fresh, extras in [("at_18d3c4a/dqn", NStepTransitionAdder(2, 3, 0.99), lambda: None),
                             ("pre_item_kinds/r2d2", OverlappingSequenceAdder(2, 8, 4),
                              lambda: {START_STATE_KEY: rng.normal(size=(2, 16)).astype(np.float32)})]:
    info = _old(run)
    with open(os.path.join(info.path, "run_state.pkl"), "rb") as f:
      old = pickle.loads(pickle.load(f)["actor"]["adder"])
    converted = Checkpointer.read_run_state(info)["actor"]["adder"]
    fresh.restore(_round_trip({"adder": converted}, str(tmp_path))["adder"])
    for t in range(20):
      step = (rng.normal(size=(2, 4)).astype(np.float32), rng.integers(0, 2, 2).astype(np.int32),
              rng.normal(size=2).astype(np.float32), rng.random(2) < 0.15, np.zeros(2, bool),
              rng.normal(size=(2, 4)).astype(np.float32), extras())
      got, want = fresh.add(*step), old.add(*step)
      assert [x.tobytes() for x in got] == [x.tobytes() for x in want], (run, t)


def test_a_format_1_run_resumed_writes_format_2_from_then_on(tmp_path):
  from jrl.experiment.resume import resumed_configs
  from jrl.run.embedded import run
  run_dir = str(tmp_path / "dqn")
  shutil.copytree(os.path.join(DATA, "at_18d3c4a", "dqn"), run_dir)
  exp, cfg = resumed_configs(run_dir, {"steps": 2_560, "progress_seconds": 0.0}, {})
  summary = run(exp, cfg)
  assert summary["resumed"] and summary["actor_steps"] == 2_560
  checkpointer = Checkpointer(run_dir)
  kept = [checkpointer.verify(path).manifest for path in checkpointer.all()]  # the run keeps one
  assert [(m["format"], m["counters"]["actor_steps"]) for m in kept] == [(2, 2_560)]
  no_pickle_files(checkpointer.all()[-1])
  assert Checkpointer.read_run_state(checkpointer.latest())["loop"]["sessions"] == 1


def test_a_checkpoint_of_an_unknown_format_is_one_line_naming_it(tmp_path):
  checkpointer = Checkpointer(str(tmp_path))
  path = checkpointer.save(None, {"learner_steps": 1}, {"actor_steps": 10})
  manifest = json.load(open(os.path.join(path, "manifest.json")))
  manifest["format"] = 3
  json.dump(manifest, open(os.path.join(path, "manifest.json"), "w"))
  with pytest.raises(ConfigError) as raised:
    checkpointer.verify(path)
  message = str(raised.value)
  assert message.splitlines() == [message] and "has format 3, this jrl reads formats 1 and 2" in message


# The data itself.

class Pair(NamedTuple):
  left: Any
  right: Any


def test_data_round_trips_exactly_and_live_objects_are_refused_by_path(tmp_path):
  tree = {"big": 2 ** 100 + 1, "nan": float("nan"), "neg_zero": -0.0, "flag": True, "none": None, "text": "a/b",
          "pair": Pair(np.arange(3, dtype=np.uint8), (np.float32(1.5), np.int64(-2))), "raw": b"\x00\xff",
          "empty": np.zeros((0, 4), np.float16), "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
          "a/b": np.ones(2), "a": {"b": np.zeros(2)}}  # two entries with one path: both kept
  back = _round_trip(tree, str(tmp_path))
  assert same(back, checkpoint_formats.as_data(tree)) == []
  assert back["pair"] == {"left": back["pair"]["left"], "right": [np.float32(1.5), np.int64(-2)]}
  assert type(back["pair"]["right"][0]) is np.float32 and back["raw"] == b"\x00\xff"

  with pytest.raises(TypeError, match=r"checkpoint data at /actor/adder: .*NStepTransitionAdder is not data"):
    checkpoint_formats.write(str(tmp_path), "bad", {"actor": {"adder": NStepTransitionAdder(1, 1, 0.9)}})
  with pytest.raises(TypeError, match=r"checkpoint data at /x: arrays of object cannot be stored"):
    checkpoint_formats.write(str(tmp_path), "bad", {"x": np.array([{}], object)})
  with pytest.raises(TypeError, match=r"checkpoint data at /: key 1"):
    checkpoint_formats.write(str(tmp_path), "bad", {1: 2})
  import ml_dtypes
  with pytest.raises(TypeError, match="arrays of bfloat16 cannot be stored as data"):
    checkpoint_formats.write(str(tmp_path), "bad", {"w": np.zeros(2, ml_dtypes.bfloat16)})


def test_a_frame_store_restored_from_its_data_knows_every_frame_it_held(tmp_path):
  """The id -> number map is not stored: the restored store rebuilds it from its ring, through
  growths (items holding old frames) and overwrites."""
  store = FrameStore(8)
  next_id, item = 1 << 40, 0
  rng = np.random.default_rng(1)
  for step in range(60):
    m = int(rng.integers(1, 4))
    store.add(np.arange(next_id, next_id + m), rng.integers(0, 255, (m, 2, 2), np.uint8))
    if step % 3 == 0:  # an item holding a frame of a few steps back
      store.item_added(item, np.asarray([store.frames_added - int(rng.integers(1, 6))]))
      item += 1
    store.items_before(item - 4)
    next_id += m
  restored = FrameStore(8)
  restored.restore(_round_trip(store.state(), str(tmp_path)))
  assert store.capacity > 8 and restored._number_of == store._number_of and list(restored._held) == list(store._held)
  numbers = np.asarray(sorted(store._number_of.values()))[-6:].reshape(2, 3)
  assert restored.decode(numbers).tobytes() == store.decode(numbers).tobytes()
