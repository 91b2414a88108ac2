"""Import-order workaround for the pinned stack.

TFP 0.25 (imported by rlax and distrax) force-loads its TensorFlow-backed
modules when TensorFlow is already imported, and those refuse TF 2.8. Where
TensorFlow is imported first and we cannot change that (Launchpad's node entry
point imports courier, hence TF, before our code), hide it from TFP's check
while rlax and distrax import; TFP's JAX substrate never touches TF.
"""

import sys


def import_jax_probability() -> None:
  if "distrax" in sys.modules and "rlax" in sys.modules:
    return
  tf = sys.modules.get("tensorflow")
  if tf is None:
    import distrax  # noqa: F401
    import rlax  # noqa: F401
    return
  del sys.modules["tensorflow"]
  try:
    import distrax  # noqa: F401,F811
    import rlax  # noqa: F401,F811
  finally:
    sys.modules["tensorflow"] = tf
