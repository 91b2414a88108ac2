"""Faults injected into a distributed program's nodes, for the project's own fault tests.

No run is meant to crash, so this is not part of the experiment config (nor of a run's
config.json): the launching process's environment carries it, and every node inherits it
(local_mp's node processes, a Slurm job's steps, a restarted node).

  JRL_INJECT_FAULTS="learner_after=20"     the learner raises after 20 calls
  JRL_INJECT_FAULTS="actor_after=400"      actor 0 raises after 400 of its env steps

`python -m launch.train` also takes the older hidden flags --crash_learner_after N and
--crash_actor_after N, and sets the variable from them.
"""

import dataclasses
import os
from typing import Mapping

from jrl.errors import ConfigError

ENV_VAR = "JRL_INJECT_FAULTS"
# Old flag -> Faults field (the flags were experiment-config fields until the config was split).
FLAGS = {"crash_learner_after": "learner_after", "crash_actor_after": "actor_after"}


@dataclasses.dataclass(frozen=True)
class Faults:
  learner_after: int = 0  # the learner raises after this many calls; 0: never
  actor_after: int = 0    # actor 0 raises after this many of its env steps; 0: never

  def check_learner(self, calls: int) -> None:
    if self.learner_after and calls >= self.learner_after:
      raise RuntimeError(f"injected learner failure after {calls} calls (crash_learner_after)")

  def check_actor(self, actor_id: int, env_steps: int) -> None:
    if self.actor_after and actor_id == 0 and env_steps >= self.actor_after:
      raise RuntimeError(f"injected actor failure after {env_steps} env steps (crash_actor_after)")


def parse(text: str) -> Faults:
  """Faults from "name=N,name=N" (the variable's format); ConfigError naming the variable."""
  values = {}
  for item in filter(None, (part.strip() for part in text.split(","))):
    name, _, number = item.partition("=")
    if name not in {f.name for f in dataclasses.fields(Faults)} or not number.isdigit():
      raise ConfigError(ENV_VAR, f"expected items like learner_after=N or actor_after=N, got '{item}'")
    values[name] = int(number)
  return Faults(**values)


def from_environment(environ: Mapping[str, str] = os.environ) -> Faults:
  return parse(environ.get(ENV_VAR, ""))


def to_environment(faults: Faults, environ=os.environ) -> None:
  """Sets the variable for the nodes this process starts."""
  given = [f"{f.name}={getattr(faults, f.name)}" for f in dataclasses.fields(Faults) if getattr(faults, f.name)]
  if given:
    environ[ENV_VAR] = ",".join(given)
