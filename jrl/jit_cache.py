"""JAX's persistent compilation cache, shared by every kind of run.

A second run of the same programs (same agent, config, shapes and devices) loads its
compiled executables instead of compiling them: for an embedded DQN run on CartPole
that is ~0.7 s of start-up (the learner's init) and ~1.5 s of its first calls.
"""

import os
from typing import Optional


def default_cache_dir() -> str:
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "jrl", "jax")


def enable_compilation_cache(path: Optional[str] = None) -> Optional[str]:
  """Turns on JAX's persistent compilation cache: `path`, else $JRL_JAX_CACHE, else
  ~/.cache/jrl/jax (JRL_JAX_CACHE=off disables it). Returns the folder in use (None: off).
  The same folder and switch as the device backend's (`jrl.run.device.runner`)."""
  import jax
  path = path or os.environ.get("JRL_JAX_CACHE") or default_cache_dir()
  if path.lower() in ("off", "0", "none", "false"):
    return None
  if jax.config.jax_compilation_cache_dir == path:
    return path
  os.makedirs(path, exist_ok=True)
  try:
    from jax._src import compilation_cache  # the public setter cannot move a cache already in use
    if getattr(compilation_cache, "_cache_initialized", False):
      compilation_cache.reset_cache()
  except (ImportError, AttributeError):
    pass
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  return path
