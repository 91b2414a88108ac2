"""The GPU locks (`make setup ACCEL=cuda12`, `make setup-core ACCEL=cuda12|cuda13`) are their CPU locks plus
JAX's accelerator wheels and nothing else: a GPU install must run the same code as the CPU install the tests
and digests were made with, so a pin that drifts in one lock and not the other would be a silent difference.
The core stack's Python 3.11 lock is its 3.12 lock but for the pins that have no 3.11 wheel.
And the set-up scripts pick the lock by ACCEL and refuse an unknown one in one line (exit 2), before touching
the venv.
"""

import os
import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

# GPU lock -> (its CPU lock, JAX version whose accelerator wheels it adds).
GPU_LOCKS = {
  "requirements-lock-cuda12.txt": ("requirements-lock.txt", "0.6.2"),
  "requirements-core-py312-cuda12.txt": ("requirements-core-py312.txt", "0.12.0.1"),
  "requirements-core-py312-cuda13.txt": ("requirements-core-py312.txt", "0.12.0.1"),
}


def _pins(name):
  """name -> version of every `name==version` line; a name twice is an error (pip would refuse it too)."""
  pins = {}
  for line in (ROOT / name).read_text().splitlines():
    line = line.split("#", 1)[0].strip()
    if not line:
      continue
    match = re.fullmatch(r"([A-Za-z0-9._-]+)==(\S+)", line)
    assert match, f"{name}: not an exact pin: {line!r}"
    key = re.sub(r"[-_.]+", "-", match.group(1)).lower()  # PEP 503: ml_dtypes == ml-dtypes
    assert key not in pins, f"{name}: {key} pinned twice"
    pins[key] = match.group(2)
  return pins


@pytest.mark.parametrize("gpu_lock", sorted(GPU_LOCKS))
def test_gpu_lock_is_its_cpu_lock_plus_jax_accelerator_wheels(gpu_lock):
  cpu_lock, jax_version = GPU_LOCKS[gpu_lock]
  cpu, gpu = _pins(cpu_lock), _pins(gpu_lock)
  changed = {name: (version, gpu.get(name)) for name, version in cpu.items() if gpu.get(name) != version}
  assert not changed, f"{gpu_lock}: pins of {cpu_lock} missing or changed (cpu, gpu): {changed}"
  added = sorted(set(gpu) - set(cpu))
  others = [name for name in added if not name.startswith(("jax-cuda", "nvidia-"))]
  assert not others, f"{gpu_lock}: adds packages that are not JAX's accelerator wheels: {others}"
  accel = gpu_lock.rsplit("-", 1)[1].removesuffix(".txt")  # cuda12 / cuda13
  # The plugin and its PJRT wheel are the accelerator's and exactly the JAX version of the CPU lock.
  assert gpu[f"jax-{accel}-plugin"] == gpu[f"jax-{accel}-pjrt"] == cpu["jax"] == cpu["jaxlib"] == jax_version
  assert [name for name in added if name.startswith("jax-cuda")] == [f"jax-{accel}-pjrt", f"jax-{accel}-plugin"]
  assert any(name.startswith("nvidia-cudnn") for name in added), f"{gpu_lock}: no cuDNN wheel"


@pytest.mark.parametrize("script,stack,accel,expected", [
  ("setup_venv.sh", "full", "rocm", "ACCEL=rocm: make setup takes ACCEL=cpu or ACCEL=cuda12"),
  ("setup_venv.sh", "full", "cuda13", "ACCEL=cuda13: make setup takes ACCEL=cpu or ACCEL=cuda12"),
  ("setup_venv.sh", "core", "rocm", "ACCEL=rocm: make setup takes ACCEL=cpu, ACCEL=cuda12 or ACCEL=cuda13"),
  ("setup_core_venv.sh", "", "tpu", "ACCEL=tpu: make setup-core takes ACCEL=cpu, ACCEL=cuda12 or ACCEL=cuda13"),
])
def test_setup_refuses_an_unknown_accelerator_in_one_line(script, stack, accel, expected, tmp_path):
  # A copy of the scripts in an empty folder: nothing is there to install into, and nothing may appear.
  (tmp_path / "scripts").mkdir()
  for name in ("setup_venv.sh", "setup_core_venv.sh", "find_python.sh"):
    (tmp_path / "scripts" / name).write_text((ROOT / "scripts" / name).read_text())
  result = subprocess.run(["bash", str(tmp_path / "scripts" / script)], capture_output=True, text=True,
                          env={**os.environ, "ACCEL": accel, "STACK": stack}, timeout=60)
  assert result.returncode == 2, result
  assert result.stderr.splitlines()[0].startswith(expected), result.stderr
  assert len(result.stderr.splitlines()) == 1 and result.stdout == ""
  assert sorted(p.name for p in tmp_path.iterdir()) == ["scripts"]


# The pins of requirements-core-py311.txt that differ from requirements-core-py312.txt: those whose 3.12 version
# has no wheel for Python 3.11 (jaxlib's 3.11 wheels end at 0.10.2; flax 0.12.9+, numpy 2.5, scipy 1.18 and
# contourpy 1.4 need 3.12).
PY311_MOVED = {"jax": "0.10.2", "jaxlib": "0.10.2", "flax": "0.12.8", "numpy": "2.4.6", "scipy": "1.17.1",
               "contourpy": "1.3.3"}


def test_the_core_lock_for_python_3_11_is_the_3_12_lock_but_for_the_pins_without_3_11_wheels():
  py312, py311 = _pins("requirements-core-py312.txt"), _pins("requirements-core-py311.txt")
  assert sorted(py311) == sorted(py312)
  differ = {name: version for name, version in py311.items() if py312[name] != version}
  assert differ == PY311_MOVED
