"""Replay layer. Only `jrl.replay.reverb_replay` imports reverb (and with it TensorFlow).

`jrl.replay.LocalReplay`, `calls_due` and `ReplaySpec` load lazily, so that importing a
submodule (e.g. `jrl.replay.spec`) stays light.
"""

_LAZY = {"LocalReplay": "jrl.replay.local", "calls_due": "jrl.replay.local", "ReplaySpec": "jrl.replay.spec"}

__all__ = sorted(_LAZY)


def __getattr__(name):
  if name in _LAZY:
    import importlib
    return getattr(importlib.import_module(_LAZY[name]), name)
  raise AttributeError(f"module 'jrl.replay' has no attribute '{name}'")
