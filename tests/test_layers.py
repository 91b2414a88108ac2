"""The import layers of pyproject.toml's [tool.importlinter] hold, and a planted upward import breaks them.

import-linter 2.16 needs Python >= 3.11: these run in the core venv (`make test-core`, CI)."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINT = os.path.join(os.path.dirname(sys.executable), "lint-imports")
pytestmark = pytest.mark.skipif(not os.path.exists(LINT) and sys.version_info < (3, 11),
                                reason="import-linter 2.16 needs Python >= 3.11 (make test-core runs these)")


def _lint(cwd):
  env = dict(os.environ, PYTHONPATH=cwd)  # the packages of `cwd`, not the installed ones
  return subprocess.run([LINT, "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_tree_keeps_its_layers_and_has_no_cycles():
  out = _lint(ROOT)
  assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
  assert "Contracts: 3 kept, 0 broken." in out.stdout, out.stdout[-2000:]


def test_a_planted_upward_import_is_refused(tmp_path):
  for name in ("jrl", "launch"):
    shutil.copytree(os.path.join(ROOT, name), tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
  shutil.copy(os.path.join(ROOT, "pyproject.toml"), tmp_path)
  with open(tmp_path / "jrl" / "networks.py", "a") as f:
    f.write("\nfrom jrl.run import embedded  # planted: networks must not import the run core\n")
  out = _lint(str(tmp_path))
  assert out.returncode == 1, out.stdout[-4000:]
  assert "jrl.networks is not allowed to import jrl.run" in out.stdout, out.stdout[-4000:]
  assert "- jrl.networks -> jrl.run.embedded" in out.stdout
