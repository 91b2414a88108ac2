"""`make setup` takes the stack a machine's Pythons allow (scripts/setup_venv.sh): the full stack where a
Python 3.10 is found, else the core stack on the newest Python 3.11-3.13 found; STACK= overrides it; a venv
keeps its own stack. Each case is a machine made of real interpreters: a folder on PATH holding only the
Pythons the case has (links to this machine's), the tools the script calls, and for the pyenv case a
pyenv root whose versions/ holds one. The script runs with JRL_SETUP_PLAN=1, which prints its choice and
touches nothing.
"""

import glob
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
TOOLS = ("bash", "cat", "cut", "grep", "ls", "sort", "dirname", "rm", "env", "head", "sed", "uname")


def _interpreter(version: str):
  """The path of a real Python `version` on this machine (PATH, then pyenv's versions), or None."""
  out = subprocess.run(["bash", "-c", f"source scripts/find_python.sh && find_python {version}"], cwd=ROOT,
                       capture_output=True, text=True)
  if out.returncode != 0:
    return None
  return subprocess.run([out.stdout.strip(), "-c", "import sys; print(sys.executable)"], capture_output=True,
                        text=True, check=True).stdout.strip()


INTERPRETERS = {version: _interpreter(version) for version in ("3.10", "3.11", "3.12", "3.13")}


def _machine(tmp_path, pythons, pyenv=()):
  """An environment whose PATH shows only `pythons` (as python3.X) and the script's tools; `pyenv`:
  versions that a pyenv root holds instead (with a `pyenv` that prints the root, as `pyenv root` does)."""
  for version in (*pythons, *pyenv):
    if INTERPRETERS[version] is None:
      pytest.skip(f"this machine has no Python {version}")
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  for tool in TOOLS:
    os.symlink(shutil.which(tool), bin_dir / tool)
  for version in pythons:
    os.symlink(INTERPRETERS[version], bin_dir / f"python{version}")
  if pyenv:
    root = tmp_path / "pyenv"
    for version in pyenv:
      folder = root / "versions" / f"{version}.99" / "bin"
      folder.mkdir(parents=True)
      os.symlink(INTERPRETERS[version], folder / "python")
    (bin_dir / "pyenv").write_text(f"#!{shutil.which('bash')}\n[ \"$1\" = root ] && echo {root}\n")
    (bin_dir / "pyenv").chmod(0o755)
  scripts = tmp_path / "repo" / "scripts"
  scripts.mkdir(parents=True)
  for name in ("setup_venv.sh", "setup_core_venv.sh", "find_python.sh"):
    shutil.copy(ROOT / "scripts" / name, scripts / name)
  for lock in glob.glob(str(ROOT / "requirements-*.txt")):
    shutil.copy(lock, tmp_path / "repo")
  return {"PATH": str(bin_dir), "HOME": str(tmp_path), "JRL_SETUP_PLAN": "1"}


def _plan(tmp_path, env, script="setup_venv.sh", **extra):
  out = subprocess.run(["bash", f"scripts/{script}"], cwd=tmp_path / "repo", env={**env, **extra},
                       capture_output=True, text=True, timeout=60)
  return out.returncode, out.stdout.strip(), out.stderr.strip()


def _version(version):
  return subprocess.run([INTERPRETERS[version], "--version"], capture_output=True, text=True).stdout.split()[1]


@pytest.mark.parametrize("pythons,stack,python,lock", [
    (("3.10", "3.12"), "full", "3.10", "requirements-lock.txt"),
    (("3.11", "3.12", "3.13"), "core", "3.13", "requirements-core-py312.txt"),
    (("3.11", "3.12"), "core", "3.12", "requirements-core-py312.txt"),
    (("3.11",), "core", "3.11", "requirements-core-py311.txt"),
])
def test_the_stack_follows_the_pythons_found(tmp_path, pythons, stack, python, lock):
  code, out, err = _plan(tmp_path, _machine(tmp_path, pythons))
  assert code == 0, err
  why = "a Python 3.10 was found" if stack == "full" else "no Python 3.10 was found on PATH or in pyenv"
  assert out == (f"[setup] plan: {stack} stack, Python {_version(python)} ({tmp_path}/bin/python{python}), "
                 f"{lock} into .venv ({why})")


def test_pythons_in_pyenv_count_as_found(tmp_path):
  code, out, err = _plan(tmp_path, _machine(tmp_path, (), pyenv=("3.11", "3.12")))
  assert code == 0, err
  assert f"core stack, Python {_version('3.12')} ({tmp_path}/pyenv/versions/3.12.99/bin/python)" in out


def test_stack_given_overrides_what_was_found(tmp_path):
  env = _machine(tmp_path, ("3.10", "3.12"))
  code, out, _ = _plan(tmp_path, env, STACK="core")
  assert code == 0 and out.startswith(f"[setup] plan: core stack, Python {_version('3.12')} ") and out.endswith(
      "requirements-core-py312.txt into .venv (STACK=core)")
  code, out, _ = _plan(tmp_path, env, STACK="core", ACCEL="cuda13")
  assert code == 0 and "requirements-core-py312-cuda13.txt into .venv" in out
  # make setup-core: the core on 3.12 into .venv-core, beside whatever .venv has.
  code, out, _ = _plan(tmp_path, env, script="setup_core_venv.sh")
  assert code == 0 and "core stack" in out and "requirements-core-py312.txt into .venv-core (STACK=core)" in out


def test_a_venv_keeps_its_stack_and_python(tmp_path):
  """A .venv made with the core stack on 3.12 stays so (no switch to the full stack because a 3.10 appears,
  nor to a newer core Python), until STACK= says otherwise."""
  env = _machine(tmp_path, ("3.10", "3.12", "3.13"))
  venv = tmp_path / "repo" / ".venv"
  (venv / "bin").mkdir(parents=True)
  os.symlink(INTERPRETERS["3.12"], venv / "bin" / "python")
  (venv / ".jrl-stack").write_text("core\n")
  code, out, _ = _plan(tmp_path, env)
  assert code == 0 and out.startswith(f"[setup] plan: core stack, Python {_version('3.12')} ") and out.endswith(
      "(the stack .venv has)")
  code, out, _ = _plan(tmp_path, env, STACK="full")
  assert code == 0 and out.startswith(f"[setup] plan: full stack, Python {_version('3.10')} ")


@pytest.mark.parametrize("pythons,extra,expected", [
    (("3.12",), {"STACK": "full"}, "STACK=full needs Python 3.10 (dm-launchpad 0.5.2 has no wheels for newer "
                                    "Pythons); none found on PATH or in pyenv. Install one, e.g. 'pyenv install "
                                    "3.10.13', then rerun; or 'make setup STACK=core'"),
    ((), {}, "STACK=core needs Python 3.11, 3.12 or 3.13; none found on PATH or in pyenv."),
    (("3.12",), {"STACK": "newest"}, "STACK=newest: make setup takes STACK=full (Python 3.10: Reverb, Launchpad) "
                                     "or STACK=core (Python 3.11-3.13)"),
    (("3.11",), {"ACCEL": "cuda12"}, "ACCEL=cuda12: the core stack's GPU locks are for Python 3.12 and 3.13"),
    (("3.12",), {"STACK": "full", "ACCEL": "cuda13"}, "ACCEL=cuda13: make setup takes ACCEL=cpu or ACCEL=cuda12 on "
                                                      "the full stack"),
])
def test_a_stack_this_machine_cannot_have_is_one_line_and_exit_2(tmp_path, pythons, extra, expected):
  code, out, err = _plan(tmp_path, _machine(tmp_path, pythons), **extra)
  assert code == 2 and out == "" and len(err.splitlines()) == 1 and err.startswith(expected), (code, out, err)
  assert not (tmp_path / "repo" / ".venv").exists()


def test_this_interpreter_is_the_stack_its_venv_says(tmp_path):
  """The venv the tests run in says which stack it is (.jrl-stack), and a run's summary says the same
  (jrl.compat.stack: whether Reverb and Launchpad import)."""
  from jrl import compat
  said = pathlib.Path(sys.prefix, ".jrl-stack")
  if not said.is_file():
    pytest.skip(f"{sys.prefix} was not made by scripts/setup_venv.sh")
  assert said.read_text().strip() == compat.stack().name
