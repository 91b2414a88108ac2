"""The earlier name of `examples/own_loop.py` (your own training loop with your own torso),
kept so that `python -m examples.custom_torso` and `from examples.custom_torso import ...` work."""

import sys

from examples.own_loop import LayerNormTorso, QHead, Result, main, train  # noqa: F401

if __name__ == "__main__":
  sys.exit(main())
