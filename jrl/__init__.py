"""jrl: a JAX-based, functional, distributed reinforcement-learning library.

The stable names, imported on first use so that `import jrl` stays light (no JAX until a
name that needs it is touched):

    import jrl
    cfg = jrl.dqn.Config()
    env = jrl.make_vector_env("CartPole-v1", num_envs=8, seed=0)
    networks = jrl.dqn.make_networks(jrl.env_spec(env), cfg, module=MyTorsoAndHead())
    learner = jrl.dqn.make_learner(networks, cfg, loss=my_loss)
    replay = jrl.LocalReplay.for_agent(cfg, num_envs=8, seed=0, env=env)

Data conventions are stated once, in `jrl.types`.

Each agent is also a module of this name, `jrl.<agent>` (`from jrl.dqn import Config`): the same
module object as `jrl.agents.<agent>`, not a copy, so a class has one identity whichever way it was
imported. The same holds for the old names of moved modules (`MOVED_MODULES`: `jrl.policies` is
`jrl.experiment.snapshots`): each name has one module, and one file.
"""

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

from jrl.registry import AGENTS

__version__ = "0.1.0"

# name -> module that defines it; modules themselves are listed with their own name.
_NAMES: Dict[str, str] = {
    # Agents: each a module of Config, Networks, TrainingState, make_networks, make_learner (with
    # its default `loss`), make_policy, make_replay_spec; `jrl.dqn` etc. for every name of
    # jrl.registry (added below).
    "agents": "jrl.agents", "get_agent": "jrl.agents", "AGENTS": "jrl.agents",
    # Types and conventions.
    "types": "jrl.types", "Transition": "jrl.types", "Trajectory": "jrl.types", "LearnerBatch": "jrl.types",
    "LearnerFns": "jrl.types", "PolicyFns": "jrl.types", "ActorState": "jrl.types", "Params": "jrl.types",
    "PRNGKey": "jrl.types", "Array": "jrl.types",
    # Networks.
    "networks": "jrl.networks", "MLP": "jrl.networks", "QNetwork": "jrl.networks",
    # Replay for your own loop.
    "replay": "jrl.replay", "LocalReplay": "jrl.replay.local", "calls_due": "jrl.replay.local",
    "ReplaySpec": "jrl.replay.spec", "ItemKind": "jrl.replay.kinds", "Transitions": "jrl.replay.kinds",
    "TrajectoryQueue": "jrl.replay.kinds", "ReplayedSequences": "jrl.replay.kinds",
    # Learner and evaluator shells.
    "Learner": "jrl.learners.learner", "make_multi_update": "jrl.learners.learner",
    "params_digest": "jrl.learners.learner", "Evaluator": "jrl.actors.evaluator",
    # Environments.
    "envs": "jrl.envs", "make_vector_env": "jrl.envs", "env_spec": "jrl.envs", "final_observations": "jrl.envs",
    "EpisodeTracker": "jrl.envs", "EnvSpec": "jrl.specs",
    # Policies of finished runs, errors.
    "policies": "jrl.policies", "load_policy": "jrl.experiment.snapshots", "ConfigError": "jrl.errors",
}

_NAMES.update(AGENTS)

# Old module paths -> the module that holds their names now. Each stays importable (`import
# jrl.policies`, `from jrl.device.envs import GymnaxVecEnv`) as the real module under its old name,
# not as a file that re-exports it: one import path per name in the tree, the old ones for users.
MOVED_MODULES: Dict[str, str] = {
    "jrl.policies": "jrl.experiment.snapshots",   # policy snapshots of finished runs
    "jrl.device.envs": "jrl.gymnax_envs",         # gymnax envs of the device backend
    "jrl.device.replay": "jrl.replay.on_device",  # windows, ring buffer and its gather
    # The drivers' one home, jrl/run/: the run core and the embedded, device and distributed drivers.
    "jrl.experiment.run_core": "jrl.run.core",
    "jrl.experiment.runner": "jrl.run.embedded",
    "jrl.device": "jrl.run.device",
    "jrl.device.loop": "jrl.run.device.loop",
    "jrl.device.runner": "jrl.run.device.runner",
    "jrl.device.sweep": "jrl.run.device.sweep",
    "launch.faults": "jrl.run.distributed.faults",
    "launch.liveness": "jrl.run.distributed.liveness",
    "launch.multihost": "jrl.run.distributed.multihost",
    "launch.placement": "jrl.run.distributed.placement",
}

__all__: List[str] = sorted(_NAMES) + ["__version__"]

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time `__getattr__` imports on demand
  from jrl import agents, envs, networks, replay, types  # noqa: F401
  from jrl.actors.evaluator import Evaluator  # noqa: F401
  from jrl.agents import AGENTS, dqn, get_agent, impala, ppo, pqn, r2d2, sac, td3  # noqa: F401
  from jrl.envs import EpisodeTracker, env_spec, final_observations, make_vector_env  # noqa: F401
  from jrl.errors import ConfigError  # noqa: F401
  from jrl.learners.learner import Learner, make_multi_update, params_digest  # noqa: F401
  from jrl.networks import MLP, QNetwork  # noqa: F401
  from jrl.experiment import snapshots as policies  # noqa: F401
  from jrl.experiment.snapshots import load_policy  # noqa: F401
  from jrl.replay.kinds import ItemKind, ReplayedSequences, TrajectoryQueue, Transitions  # noqa: F401
  from jrl.replay.local import LocalReplay, calls_due  # noqa: F401
  from jrl.replay.spec import ReplaySpec  # noqa: F401
  from jrl.specs import EnvSpec  # noqa: F401
  from jrl.types import (ActorState, Array, LearnerBatch, LearnerFns, Params, PolicyFns, PRNGKey,  # noqa: F401
                         Trajectory, Transition)


def _moved_child(fullname: str) -> Optional[str]:
  """Where a moved package's old child went, asked for under the package's new name:
  `from jrl.device import replay` looks up `jrl.run.device.replay` (the import statement asks for
  the submodule under the name of the module `jrl.device` is), which is `jrl.device.replay`'s."""
  for old, new in MOVED_MODULES.items():
    if fullname.startswith(new + "."):
      moved = MOVED_MODULES.get(old + fullname[len(new):])
      if moved is not None and moved != fullname:
        return moved
  return None


class _ModuleAliases(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  """`import jrl.dqn` (and `jrl.dqn.<submodule>`) loads `jrl.agents.dqn` and binds that module to
  the short name, for every agent of jrl.registry; `import jrl.policies` (any old path of
  `MOVED_MODULES`) binds the module it moved to.

  Attribute access (`jrl.dqn`) goes through `__getattr__` below, but the import statement looks
  names up in `sys.modules` and the finders, never in a package's attributes: without this finder
  `from jrl.dqn import Config` in a user's module fails with ModuleNotFoundError. A finder rather
  than an eager `sys.modules` entry keeps `import jrl` light (the agent, and JAX, load on first use);
  aliasing rather than a forwarding file keeps one module object per agent. It answers only for
  `jrl.<agent>` names and the old paths, and sits first on `sys.meta_path`, so the path finder never
  loads a second copy of a submodule from `jrl.dqn.__path__`.
  """

  @staticmethod
  def target(fullname: str) -> Optional[str]:
    """The real module behind the alias `fullname`, or None when it is no alias."""
    if fullname in MOVED_MODULES:
      return MOVED_MODULES[fullname]
    moved_child = _moved_child(fullname)
    if moved_child is not None:
      return moved_child
    parts = fullname.split(".")
    if len(parts) < 2 or parts[0] != __name__ or parts[1] not in AGENTS:
      return None
    return f"{__name__}.agents.{fullname.split('.', 1)[1]}"

  def find_spec(self, fullname: str, path: Optional[Sequence[str]] = None,
                target: Optional[ModuleType] = None) -> Optional[importlib.machinery.ModuleSpec]:
    del path, target
    real = self.target(fullname)
    if real is None:
      return None
    # A moved module is a plain module (no `__path__` may be added to it); an agent is a package.
    agent = fullname not in MOVED_MODULES and _moved_child(fullname) is None
    return importlib.machinery.ModuleSpec(fullname, self, is_package=agent)

  def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
    real = importlib.import_module(self.target(spec.name))
    spec.loader_state = real.__spec__
    return real

  def exec_module(self, module: ModuleType) -> None:
    # The import machinery set the alias's spec on the module (its other attributes it leaves alone);
    # the module keeps its own, so `importlib.reload` and tools that read `__spec__` see the real name.
    module.__spec__ = module.__spec__.loader_state


if not any(isinstance(finder, _ModuleAliases) for finder in sys.meta_path):
  sys.meta_path.insert(0, _ModuleAliases())


def __getattr__(name: str) -> Any:
  module_name = _NAMES.get(name)
  if module_name is None:
    raise AttributeError(f"module 'jrl' has no attribute '{name}'")
  module = importlib.import_module(module_name)
  value = module if module_name.rsplit(".", 1)[-1] == name else getattr(module, name)
  globals()[name] = value  # later lookups skip this function
  return value


def __dir__() -> List[str]:
  return sorted(set(globals()) | set(__all__))
