"""Test selection: two tiers, and the two installs.

Tiers: tests that train to a threshold or start real programs (Launchpad, Slurm, whole
`launch.*` commands) are marked `slow`. `make test` runs the rest (`-m "not slow"`, a few
minutes); `make test-all` runs both (CI), the slow tier two tests at a time (`--dist worksteal`:
the tests on the project's test hosts one after another, `holding_test_hosts`). Tests marked `long`
as well (learning runs of many minutes, e.g. to a threshold across a three-host Slurm cluster, and
the benchmarks' own runs) run only with `make test-long`; each learning run has a short sibling in
the slow tier that checks the same wiring.

Stacks: tests that need the full stack (reverb, launchpad, TensorFlow: the jrl[distributed]
extra, Python 3.10) are marked `needs_reverb`. `pytest --core` (the core stack, Python 3.11-3.13:
`make test` where .venv has it, `make test-core`) deselects them and runs the rest, the device
backend's too (gymnax is in both stacks; its tests are marked `needs_gymnax`). A file whose every
test needs the full stack says so in its `pytestmark = ...` line; `--core` does not even import it
(its imports need that stack). A `--core` run in which no test passed fails: an empty or
all-skipped run proves nothing. Without `--core` (the full stack) the tests marked `needs_ray` are
deselected, and a file whose `pytestmark` names it is not imported: Ray is the core stack's engine
(ray 2.60 needs protobuf>=3.20.3, TensorFlow 2.8 protobuf<3.20). Nothing else is deselected, so a
missing package fails loudly.
"""

import contextlib
import fcntl
import os
import shutil
import subprocess
import tempfile

import pytest

# Tests run commands as a user types them in a fresh shell. Under `make test` the make variables
# below are inherited, and a `make` a test runs would then act as a sub-make (printing
# "make[1]: Entering directory ..." around its output, taking the outer make's flags).
for _name in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES"):
  os.environ.pop(_name, None)

# TFP (via rlax/distrax) refuses TF 2.8 once TensorFlow is loaded; tests that import reverb
# run in the same process, so load these first.
import distrax  # noqa: F401
import rlax  # noqa: F401

CORE_EXCLUDED = ("needs_reverb",)
FULL_EXCLUDED = ("needs_ray",)  # Ray is the core stack's engine: it does not install beside TensorFlow 2.8


def pytest_addoption(parser):
  parser.addoption("--core", action="store_true",
                   help="run only the core tests (deselect tests marked " + " or ".join(CORE_EXCLUDED)
                   + "); fail when none passes")


def pytest_configure(config):
  config.addinivalue_line("markers", "needs_reverb: needs reverb, launchpad or TensorFlow (jrl[distributed], "
                          "Python 3.10)")
  config.addinivalue_line("markers", "needs_gymnax: needs gymnax (the device backend)")
  config.addinivalue_line("markers", "needs_ray: needs Ray (the core stack's engine; deselected on the full stack)")
  config.addinivalue_line("markers", "slow: trains to a threshold or starts real programs (make test-all)")
  config.addinivalue_line("markers", "long: a learning run of many minutes (make test-long; not in make test-all)")


def pytest_report_header(config):
  if config.getoption("--core"):
    return f"jrl: core run (tests marked {', '.join(CORE_EXCLUDED)} deselected)"
  return None


def pytest_ignore_collect(collection_path, config):
  if collection_path.suffix != ".py":
    return None
  marker = "needs_reverb" if config.getoption("--core") else "needs_ray"
  try:
    with open(collection_path) as f:
      if any(line.startswith("pytestmark =") and marker in line for line in f):
        return True
  except OSError:
    pass
  return None


# The fixtures of the project's test hosts (network namespaces 10.200.0.x: a Slurm cluster, or Ray nodes).
# They are one set per machine: a test holds them through `holding_test_hosts` (a lock other pytest workers
# wait on), and their tests come first in the collection, so that under `--dist worksteal` one worker
# starts on them at once and the other takes the rest (a worker steals from the end of another's queue).
# (pytest-xdist's xdist_group marks do not group tests under pytest 9: its worker's node ids keep no group.)
TEST_HOSTS_FIXTURES = ("slurm", "two_ray_hosts")
TEST_HOSTS_LOCK = os.path.join(tempfile.gettempdir(), "jrl-test-hosts.lock")


def on_test_hosts(item) -> bool:
  return bool(set(TEST_HOSTS_FIXTURES) & set(getattr(item, "fixturenames", ())))


@contextlib.contextmanager
def holding_test_hosts():
  """The project's test hosts for this process alone while inside (an exclusive lock on TEST_HOSTS_LOCK)."""
  with open(TEST_HOSTS_LOCK, "a") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)


def pytest_collection_modifyitems(config, items):
  excluded = CORE_EXCLUDED if config.getoption("--core") else FULL_EXCLUDED
  kept, deselected = [], []
  for item in items:
    (deselected if any(item.get_closest_marker(m) for m in excluded) else kept).append(item)
  if deselected:
    config.hook.pytest_deselected(items=deselected)
  items[:] = sorted(kept, key=lambda item: not on_test_hosts(item))  # stable: the same order in every worker


_passed = []  # tests that passed, as reported to this process (with -n: the controller hears every worker)


def pytest_runtest_logreport(report):
  if report.when == "call" and report.passed:
    _passed.append(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
  config = session.config
  if hasattr(config, "workerinput"):  # a pytest-xdist worker: the controller judges the whole run
    return
  if config.getoption("--core") and exitstatus == 0 and not _passed:
    print("\nconftest: --core run in which no test passed; failing", flush=True)
    session.exitstatus = 1


SLURM_CLUSTER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts",
                             "slurm_test_cluster.sh")
needs_slurm = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("slurmctld") is None or shutil.which("munged") is None,
    reason="needs root and Debian's slurm-wlm + munge (.ci/run installs them)")


@pytest.fixture
def slurm():
  """A fresh 3-host Slurm cluster (scripts/slurm_test_cluster.sh: network namespaces on this
  machine) for one test; the environment that points Slurm's commands at it."""
  with holding_test_hosts():
    state = tempfile.mkdtemp(prefix="jrl-slurm-")  # munged wants every folder above its socket searchable
    up = subprocess.run([SLURM_CLUSTER, "up", state], capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stdout + up.stderr
    yield dict(os.environ, SLURM_CONF=os.path.join(state, "slurm.conf"))
    down = subprocess.run([SLURM_CLUSTER, "down", state], capture_output=True, text=True, timeout=180)
    assert down.returncode == 0, down.stderr
    shutil.rmtree(state, ignore_errors=True)



ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def resumed_by_writer(tmp_path):
  """resumed_by_writer(commit, run_dir, steps) -> the summary the code at `commit` (from git)
  ends with when it resumes a copy of `run_dir` to `steps` here (`launch.train --resume`, its own
  command). Run directories kept under tests/data are checked against the code that wrote them
  this way, not against digests recorded once: XLA's CPU kernels round differently on another
  processor. Skips where git has not that commit."""
  import json
  import sys

  def resume(commit: str, run_dir: str, steps: int):
    folder = tempfile.mkdtemp(prefix=f"writer-{commit[:7]}-", dir=str(tmp_path))
    code, copy = os.path.join(folder, "code"), os.path.join(folder, "run")
    archive = subprocess.run(["git", "-C", ROOT, "archive", commit, "jrl", "launch"], capture_output=True)
    if archive.returncode != 0:
      pytest.skip(f"the writer's code (commit {commit[:7]}) is not in this checkout's git history")
    os.makedirs(code)
    subprocess.run(["tar", "-x", "-C", code], input=archive.stdout, check=True)
    shutil.copytree(run_dir, copy)
    out = subprocess.run([sys.executable, "-m", "launch.train", "--resume", copy, "--steps", str(steps),
                          "--progress_seconds", "0"], cwd=code, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    with open(os.path.join(copy, "summary.json")) as f:
      return json.load(f)
  return resume
