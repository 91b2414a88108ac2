"""Errors that users cause and can fix; the command line prints them as one line."""


class ConfigError(ValueError):
  """A bad configuration value, environment or agent, found before any work starts.

  The message names the offending field, e.g. "batch_size: must be > 0, got 0".
  """

  def __init__(self, field: str, problem: str):
    self.field = field
    self.problem = problem
    super().__init__(f"{field}: {problem}")


class Stopped(Exception):
  """The surrounding program asked this component to stop; not a failure."""


class RunDirError(ConfigError):
  """A run directory, or a file in it, that cannot be used: missing, not a run, a missing or
  corrupt policy snapshot. The message names the path, e.g.
  "run_dir: 'runs/x' is not a run directory (no config.json)".
  """


def require(config, names, test, wanted: str) -> None:
  """ConfigError naming the first of `names` whose value on `config` fails `test`;
  `wanted` completes "must be ...", e.g. "> 0"."""
  for name in names:
    value = getattr(config, name)
    if not test(value):
      raise ConfigError(name, f"must be {wanted}, got {value}")


def require_positive(config, *names: str) -> None:
  require(config, names, lambda v: v > 0, "> 0")


def require_non_negative(config, *names: str) -> None:
  require(config, names, lambda v: v >= 0, ">= 0")


def require_unit_interval(config, *names: str) -> None:
  require(config, names, lambda v: 0.0 <= v <= 1.0, "in [0, 1]")
