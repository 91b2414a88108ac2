"""A checkpoint's run state and seeded replay on disk, by format: what `Checkpointer` writes
(format 2) and the one converter that reads what it wrote before (format 1).

Format 2 keeps a state as data only, in two files a person can read without jrl:

  NAME.json  the tree: dicts (str keys), lists, str, int (any size: numpy's PCG64 state), float
             (NaN and infinities as Python's json writes them), bool and null; each array in
             its place as {"__array__": KEY} ({"__array__": KEY, "scalar": true} for a numpy
             scalar), each opaque byte string as {"__bytes__": KEY}
  NAME.npz   the arrays by KEY (their path in the tree), read with np.load(allow_pickle=False);
             a byte string is a uint8 array

    tree = json.load(open("run_state.json")); arrays = np.load("run_state.npz", allow_pickle=False)

Tuples come back as lists and NamedTuples as dicts of their fields: the restorers rebuild them
against the structures they already have (`jrl.types.rebuild`, `jrl.types.as_named`). The only
byte strings are the actor's envs (`Actor.state`): gymnasium envs have no state-as-data API, so
they stay a pickle of the envs themselves, the one pickle left in a checkpoint (None where the
envs refuse it).

Format 1 pickled the state, live objects included (adders, the replay's frame store and RNG).
`from_format_1` is the only place that unpickles it: it turns each live object into the data its
class's `state()` gives now, reading the attributes the object had when it was pickled, so the
classes carry no compatibility code of their own.
"""

import collections
import io
import json
import os
import pickle
from typing import Any, Callable, Dict

import numpy as np

_ARRAY, _BYTES = "__array__", "__bytes__"


def as_data(tree: Any, path: str = "") -> Any:
  """`tree` with NamedTuples as dicts of their fields and tuples as lists: the tree format 2 keeps
  (a restorer gets the same from a format-2 file and from `from_format_1`). TypeError naming the
  path for anything that is not data (a live object, a dict key that is not a str)."""
  if isinstance(tree, tuple) and hasattr(tree, "_fields"):
    return {f: as_data(v, f"{path}/{f}") for f, v in zip(tree._fields, tree)}
  if isinstance(tree, dict):
    for key in tree:
      if not isinstance(key, str) or key in (_ARRAY, _BYTES):
        raise TypeError(f"checkpoint data at {path or '/'}: key {key!r} (keys are strings other than "
                        f"{_ARRAY} and {_BYTES})")
    return {k: as_data(v, f"{path}/{k}") for k, v in tree.items()}
  if isinstance(tree, (list, tuple)):
    return [as_data(v, f"{path}/{i}") for i, v in enumerate(tree)]
  if tree is None or isinstance(tree, (str, bool, int, float, bytes, np.ndarray, np.generic)):
    return tree
  raise TypeError(f"checkpoint data at {path or '/'}: {type(tree).__module__}.{type(tree).__qualname__} "
                  "is not data (dicts, lists, str, int, float, bool, None, numpy arrays, bytes)")


def _storable(array: np.ndarray, path: str) -> np.ndarray:
  """The array as .npy keeps it exactly; TypeError for one it would pickle or change (objects, and
  dtypes .npy has no name for, such as ml_dtypes' bfloat16)."""
  fmt = np.lib.format
  if array.dtype.hasobject or fmt.descr_to_dtype(fmt.dtype_to_descr(array.dtype)) != array.dtype:
    raise TypeError(f"checkpoint data at {path or '/'}: arrays of {array.dtype} cannot be stored as data")
  return array


def write(folder: str, name: str, tree: Any) -> None:
  """Writes `tree` (data, `as_data`) as NAME.json and NAME.npz in `folder`."""
  arrays: Dict[str, np.ndarray] = {}

  def key_for(path: str) -> str:
    key, copy = path or ".", 0
    while key in arrays:  # a dict key holding "/" may spell another entry's path
      copy += 1
      key = f"{path}#{copy}"
    return key

  def split(node: Any, path: str) -> Any:
    if isinstance(node, dict):
      return {k: split(v, f"{path}/{k}") for k, v in node.items()}
    if isinstance(node, list):
      return [split(v, f"{path}/{i}") for i, v in enumerate(node)]
    if isinstance(node, bytes):
      key = key_for(path)
      arrays[key] = np.frombuffer(node, np.uint8)
      return {_BYTES: key}
    if isinstance(node, (np.ndarray, np.generic)):
      key = key_for(path)
      arrays[key] = _storable(np.asarray(node), path)
      return {_ARRAY: key, "scalar": True} if isinstance(node, np.generic) else {_ARRAY: key}
    return node

  tree = split(as_data(tree), "")
  with open(os.path.join(folder, f"{name}.json"), "w") as f:
    json.dump(tree, f, indent=1)
  with open(os.path.join(folder, f"{name}.npz"), "wb") as f:
    np.savez(f, **arrays)


def read(folder: str, name: str) -> Any:
  """The tree `write` wrote, arrays in place (numpy scalars as such, byte strings as bytes)."""
  with open(os.path.join(folder, f"{name}.json")) as f:
    tree = json.load(f)
  with np.load(os.path.join(folder, f"{name}.npz"), allow_pickle=False) as arrays:

    def join(node: Any) -> Any:
      if isinstance(node, dict):
        if _ARRAY in node:
          array = arrays[node[_ARRAY]]
          return array[()] if node.get("scalar") else array
        if _BYTES in node:
          return arrays[node[_BYTES]].tobytes()
        return {k: join(v) for k, v in node.items()}
      if isinstance(node, list):
        return [join(v) for v in node]
      return node

    return join(tree)


# Format 1.

class _Pickled:
  """A live object of a format-1 pickle, as the attributes it was pickled with (`fields`)."""
  kind = ""

  def __setstate__(self, state: Dict[str, Any]) -> None:
    self.fields = state


def _nstep_adder(fields):
  return {"count": fields["_count"], "obs": fields["_obs"], "act": fields["_act"], "rew": fields["_rew"]}


def _frame_store(fields):
  held = np.asarray(list(fields["_held"]), np.int64).reshape(-1, 2)
  return {"capacity": fields["_capacity"], "frames": fields["_frames"], "ids": fields["_ids"],
          "arrived": fields["_arrived"], "held": held}


# Class name -> its data as `state()` gives it now, from the attributes of its format-1 pickle. A
# class is found by its name in any jrl module: some were pickled under modules that re-exported
# them (`RewardClipAdder` under jrl.experiment.builder).
_LIVE: Dict[str, Callable[[Dict[str, Any]], Any]] = {
    "NStepTransitionAdder": _nstep_adder,
    "SequenceAdder": lambda fields: {"steps": list(fields["_steps"])},
    "OverlappingSequenceAdder": lambda fields: {"steps": list(fields["_steps"]), "count": fields["_count"]},
    "RewardClipAdder": lambda fields: _converted(fields["adder"]),  # it clips; it keeps nothing
    "FrameSharingAdder": lambda fields: {"adder": _converted(fields["adder"]), "encoder": _converted(fields["encoder"])},
    "FrameEncoder": lambda fields: {"next": fields["_next"], "last": fields["_last"], "ids": fields["_ids"]},
    "FrameStore": _frame_store,
}


class _Unpickler(pickle.Unpickler):
  """Format-1 pickles with jrl's live objects as `_Pickled` records; all else as pickle makes it."""

  def find_class(self, module: str, name: str) -> Any:
    if module.split(".")[0] == "jrl" and name in _LIVE:
      return type(name, (_Pickled,), {"kind": name})
    return super().find_class(module, name)


def _unpickled(data: bytes) -> Any:
  return _Unpickler(io.BytesIO(data)).load()


def _converted(node: Any) -> Any:
  """A format-1 tree with its live objects as data."""
  if isinstance(node, _Pickled):
    try:
      return _LIVE[node.kind](node.fields)
    except KeyError as e:
      raise ValueError(f"a format-1 {node.kind} without {e.args[0]}: written by a jrl this version does not "
                       "read") from None
  if isinstance(node, np.random.Generator):
    return node.bit_generator.state
  if isinstance(node, dict):
    node = dict(node)
    if isinstance(node.get("adder"), bytes) and "envs" in node:  # an actor's state: its adder was pickled apart
      node["adder"] = _unpickled(node["adder"])
      node.setdefault("is_first", np.zeros(len(node["obs"]), bool))  # before episode starts were kept
      node.setdefault("ahead", None)  # before actions were asked for ahead
    if "_storage" in node and "_priorities" in node:  # the seeded buffer's
      node.setdefault("_frames", None)  # before frame sharing
    return {k: _converted(v) for k, v in node.items()}
  if isinstance(node, (list, tuple, collections.deque)) and not hasattr(node, "_fields"):
    return [_converted(v) for v in node]
  if isinstance(node, tuple):  # a NamedTuple: its fields
    return {f: _converted(v) for f, v in zip(node._fields, node)}
  return node


def from_format_1(path: str) -> Any:
  """The data format 2 holds for the format-1 pickle at `path` (a run state or the seeded
  replay's contents): each live object as its class's `state()` now gives it."""
  with open(path, "rb") as f:
    return as_data(_converted(_unpickled(f.read())))
