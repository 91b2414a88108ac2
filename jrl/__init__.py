"""jrl: a JAX-based, functional, distributed reinforcement-learning library."""

__version__ = "0.1.0"


def __getattr__(name):
  # Lazy, so that `import jrl` stays light (no JAX until a policy is loaded).
  if name == "load_policy":
    from jrl.policies import load_policy
    return load_policy
  raise AttributeError(f"module 'jrl' has no attribute '{name}'")
