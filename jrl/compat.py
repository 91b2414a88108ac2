"""Import-order workarounds for the pinned stack, and which of jrl's two stacks this install is.

The full stack (Python 3.10: Reverb, Launchpad, TensorFlow 2.8, JAX 0.6.2) and the core stack (Python
3.11-3.13, current JAX, no Reverb, Launchpad or TensorFlow): `stack()` says which, and
`check_distributed_stack` refuses in one line what only the full stack runs.

TFP 0.25 (imported by rlax and distrax) imports TensorFlow whenever it is installed,
only to copy docstrings (tensorflow_probability/python/internal/backend/jax/_utils.py):
1.5-2 s of start-up that runs without Reverb never need. While rlax and distrax import,
TensorFlow is made unimportable (TFP then skips the docstrings); a later
`import tensorflow` (Reverb's) works as usual.

Where TensorFlow is already imported (Launchpad's node entry point imports courier,
hence TF, before our code), TFP 0.25 would force-load its TensorFlow-backed modules,
and those refuse TF 2.8: hide it from TFP's check while rlax and distrax import; TFP's
JAX substrate never touches TF.
"""

import sys
from typing import NamedTuple


def import_jax_probability() -> None:
  if "distrax" in sys.modules and "rlax" in sys.modules:
    return
  tf = sys.modules.get("tensorflow")
  if tf is None:
    blocked = "tensorflow" not in sys.modules
    if blocked:
      sys.modules["tensorflow"] = None  # `import tensorflow` raises ImportError meanwhile
    try:
      import distrax  # noqa: F401
      import rlax  # noqa: F401
    finally:
      if blocked and sys.modules.get("tensorflow", 0) is None:
        del sys.modules["tensorflow"]
    return
  del sys.modules["tensorflow"]
  try:
    import distrax  # noqa: F401,F811
    import rlax  # noqa: F401,F811
  finally:
    sys.modules["tensorflow"] = tf


def import_reverb() -> None:
  """Imports reverb (and so TensorFlow) without TensorFlow's eager load of Keras.

  TF 2.8's `__init__` imports the whole Keras package (~0.4 s) and skips it on an
  ImportError; Reverb never uses Keras. Keras stays importable afterwards (`tf.keras`
  loads it on first use). Where TensorFlow is already loaded this is a plain import.
  """
  import_jax_probability()
  if "reverb" in sys.modules:
    return
  blocked = "tensorflow" not in sys.modules and "keras" not in sys.modules
  if blocked:
    sys.modules["keras"] = None
  try:
    import reverb  # noqa: F401
  finally:
    if blocked and sys.modules.get("keras", 0) is None:
      del sys.modules["keras"]


# The full stack's own modules: the jrl[distributed] extra (Python 3.10 only: dm-launchpad 0.5.2 has no
# newer wheels). A core install (Python 3.11-3.13) lacks them.
DISTRIBUTED_STACK = ("reverb", "launchpad", "tensorflow")
# How to get the full stack, for the one-line refusals.
FULL_STACK_HINT = ("the full stack: Python 3.10 with Reverb and Launchpad ('make setup STACK=full'; "
                   "without a Python 3.10, 'pyenv install 3.10.13' first)")


class Stack(NamedTuple):
  """Which of jrl's two stacks this process runs on, and its Python and JAX versions."""
  name: str    # 'full' (Reverb and Launchpad importable) or 'core'
  python: str  # e.g. '3.12.1'
  jax: str     # e.g. '0.12.0.1'


def missing_distributed_stack() -> tuple:
  """The modules of the distributed stack that are not installed; () when it is complete.
  Looks them up without importing them."""
  import importlib.util
  return tuple(name for name in DISTRIBUTED_STACK if importlib.util.find_spec(name) is None)


def stack() -> Stack:
  """This install's stack, looked up without importing Reverb, Launchpad or JAX."""
  import importlib.metadata
  import platform
  try:
    jax_version = importlib.metadata.version("jax")
  except importlib.metadata.PackageNotFoundError:
    jax_version = "none"
  return Stack("core" if missing_distributed_stack() else "full", platform.python_version(), jax_version)


def check_distributed_stack(field: str, use: str) -> None:
  """ConfigError naming `field` when the distributed stack is missing (`use` says what needs it)."""
  missing = missing_distributed_stack()
  if missing:
    from jrl.errors import ConfigError
    here = stack()
    raise ConfigError(field, f"{use} needs {FULL_STACK_HINT}; this install is the core stack (Python {here.python}, "
                             f"JAX {here.jax}; no {', '.join(missing)})")
