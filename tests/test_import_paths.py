"""One import path per public name: no module of the tree re-exports another's names, and the old
paths of moved modules (`jrl.policies`, `jrl.device.envs`, `jrl.device.replay`) import as the real
module object itself, not as a copy or a forwarding file.
"""

import ast
import os
import pathlib
import subprocess
import sys
from typing import Dict, List, Tuple

import pytest

import jrl

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROJECT_PACKAGES = ("jrl", "launch", "bench", "examples")
# Re-exports that are interface of their own, each with its reason.
KEPT: Dict[Tuple[str, str], str] = {
    ("examples/custom_torso.py", "*"): "`python -m examples.custom_torso` needs a file (the old name of own_loop)",
    ("bench/minatar_paper_dqn_adam.py", "*"): "an agent module (--agent): its protocol is these names",
}


def _exported(tree: ast.Module) -> set:
  """The names of a module's `__all__`."""
  for node in tree.body:
    if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
      return {elt.value for elt in ast.walk(node.value) if isinstance(elt, ast.Constant)}
  return set()


def _used_names(tree: ast.Module) -> set:
  used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
  # Names in string annotations (`timer: "PhaseTimer"`); `__all__`'s strings export, they do not use.
  strings = [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)]
  return used | ({name for name in strings if name.isidentifier()} - _exported(tree))


def reexports(path: pathlib.Path, source: str) -> List[str]:
  """Names a module imports from the project at its top level and never uses, or lists in its
  `__all__`: re-exports (an `__init__.py`'s imports are its package's names)."""
  if path.name == "__init__.py":
    return []
  tree = ast.parse(source)
  used, exported = _used_names(tree), _exported(tree)
  names = []
  for node in tree.body:
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] in PROJECT_PACKAGES:
      names += [name for name in (alias.asname or alias.name for alias in node.names)
                if name not in used or name in exported]
  return names


def _project_files():
  for package in PROJECT_PACKAGES:
    yield from sorted((ROOT / package).rglob("*.py"))


def test_no_module_re_exports_another_modules_names():
  found = []
  for path in _project_files():
    rel = path.relative_to(ROOT).as_posix()
    for name in reexports(path, path.read_text()):
      if (rel, name) not in KEPT and (rel, "*") not in KEPT:
        found.append(f"{rel}: {name}")
  assert found == [], "import these from the module that defines them:\n" + "\n".join(found)


def test_the_check_finds_a_forwarding_module():
  """What jrl/policies.py was: a docstring and an import of names it never used."""
  forwarding = '"""Policies."""\n\nfrom jrl.experiment.snapshots import (  # noqa: F401\n    Policy, load_policy)\n'
  assert reexports(pathlib.Path("jrl/policies.py"), forwarding) == ["Policy", "load_policy"]
  used = "from jrl.timing import PhaseTimer, NULL_TIMER\n\ndef f(t: 'PhaseTimer'):\n  return t or NULL_TIMER\n"
  assert reexports(pathlib.Path("jrl/x.py"), used) == []
  listed = "from jrl.replay.on_device import Ring, ring_init\n\n__all__ = ['Ring', 'ring_init', 'gather']\n\ndef gather(r: Ring): ...\n"
  assert reexports(pathlib.Path("jrl/run/device/replay.py"), listed) == ["Ring", "ring_init"]


def test_moved_modules_have_no_file():
  for old in jrl.MOVED_MODULES:
    base = ROOT.joinpath(*old.split("."))
    assert not base.with_suffix(".py").exists() and not (base / "__init__.py").exists(), old


# A user's module, run in a fresh interpreter: its first import of each old path goes through the
# alias (nothing imported it before), and each name is the object its real module defines.
USER_MODULE = """
import sys
import jrl
assert "jrl.experiment.snapshots" not in sys.modules  # import jrl stays light
params_loader = jrl.policies.load_params                # attribute access, as the docs once showed
import jrl.policies
from jrl.policies import load_policy, load_params
from jrl.experiment import snapshots
assert jrl.policies is snapshots is sys.modules["jrl.policies"]
assert load_policy is snapshots.load_policy is jrl.load_policy and load_params is params_loader
assert snapshots.__spec__.name == "jrl.experiment.snapshots" and not hasattr(snapshots, "__path__")

from jrl.device.envs import GymnaxVecEnv, reward_threshold
import jrl.device.envs
from jrl import gymnax_envs
assert jrl.device.envs is gymnax_envs and GymnaxVecEnv is gymnax_envs.GymnaxVecEnv
assert reward_threshold("gymnax:CartPole-v1") == 475.0

from jrl.device import replay as device_replay
from jrl.device.replay import make_gather, ring_insert
from jrl.replay import on_device
assert device_replay is on_device and make_gather is on_device.make_gather and ring_insert is on_device.ring_insert

import jrl.experiment.run_core
from jrl.experiment.runner import run
from jrl.device.sweep import run_device_sweep
from jrl.run import core, embedded
from jrl.run.device import sweep
assert jrl.experiment.run_core is core and run is embedded.run and run_device_sweep is sweep.run_device_sweep
assert sys.modules["jrl.device"] is sys.modules["jrl.run.device"]

from jrl.experiment import report
from jrl import timing
assert report.PhaseTimer is timing.PhaseTimer and report.NULL_TIMER is timing.NULL_TIMER
assert report.watch_compiles is timing.watch_compiles and report.INSERT == timing.INSERT
try:
  report.no_such_name
except AttributeError as e:
  assert "no_such_name" in str(e)
else:
  raise AssertionError("report.no_such_name")
print("ok")
"""


@pytest.mark.needs_gymnax  # jrl.device.envs is jrl.gymnax_envs, which imports gymnax
def test_old_paths_are_the_real_modules(tmp_path):
  (tmp_path / "user_module.py").write_text(USER_MODULE)
  out = subprocess.run([sys.executable, "user_module.py"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)))
  assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


@pytest.mark.needs_reverb  # the distributed driver imports launchpad
def test_the_distributed_drivers_old_paths_are_its_modules(tmp_path):
  """launch/placement.py and its neighbours moved into jrl/run/distributed/; a user's script that
  imports them by the old paths gets the same modules (a `launch` import alone installs the alias)."""
  user = ("import sys\nimport launch.placement\n"
          "from jrl.run.distributed import placement\n"
          "assert launch.placement is placement\nprint('ok')\n")
  (tmp_path / "user_script.py").write_text(user)
  out = subprocess.run([sys.executable, "user_script.py"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)))
  assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
