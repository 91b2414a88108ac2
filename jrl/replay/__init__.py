"""Replay layer. Only `jrl.replay.reverb_replay` imports reverb (and with it TensorFlow).

What an agent stores is its item kind (`jrl.replay.kinds`: `Transitions`, `TrajectoryQueue`,
`ReplayedSequences`), named in its `ReplaySpec`; every path composes replay through it.

`jrl.replay.LocalReplay`, `calls_due`, `ReplaySpec` and the kinds load lazily, so that importing
`jrl.replay` stays light.
"""

_LAZY = {"LocalReplay": "jrl.replay.local", "calls_due": "jrl.replay.local", "ReplaySpec": "jrl.replay.spec",
         "ItemKind": "jrl.replay.kinds", "Transitions": "jrl.replay.kinds", "TrajectoryQueue": "jrl.replay.kinds",
         "ReplayedSequences": "jrl.replay.kinds"}

__all__ = sorted(_LAZY)


def __getattr__(name):
  if name in _LAZY:
    import importlib
    return getattr(importlib.import_module(_LAZY[name]), name)
  raise AttributeError(f"module 'jrl.replay' has no attribute '{name}'")
