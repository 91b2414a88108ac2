"""jrl: a JAX-based, functional, distributed reinforcement-learning library."""

__version__ = "0.1.0"
