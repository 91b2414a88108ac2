"""The sharded learner equals the single-device one: forced CPU devices and two real processes."""

import json
import os
import subprocess
import sys

import numpy as np
import portpicker
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "sharding_worker.py")


def _run_worker(out, *args, host_devices=1, wait=True):
  env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={host_devices}",
             PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
  proc = subprocess.Popen([sys.executable, WORKER, str(out), *map(str, args)], env=env, cwd=ROOT, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  if wait:
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output
  return proc


def _load(path):
  data = np.load(path)
  leaves = [data[f"leaf{i}"] for i in range(len(data.files) - 1)]
  return json.loads(str(data["facts"])), leaves


@pytest.fixture(scope="module")
def single_device(tmp_path_factory):
  out = tmp_path_factory.mktemp("single") / "single.npz"
  _run_worker(out, "--devices", 1)
  return _load(out)


@pytest.mark.parametrize("devices", [1, 2, 4])
def test_sharded_update_equals_single_device(tmp_path, single_device, devices):
  out = tmp_path / f"mesh{devices}.npz"
  _run_worker(out, "--devices", devices, host_devices=devices)
  facts, leaves = _load(out)
  assert facts["devices"] == devices and facts["version"] == 3
  assert facts["cache_size"] == 1, "recompiled after the first call"
  assert facts["same_structure"] and facts["same_dtypes"]
  assert facts["param_spec"] == []  # replicated
  for ours, reference in zip(leaves, single_device[1]):
    np.testing.assert_allclose(ours, reference, rtol=1e-5, atol=1e-6)
  assert any(not np.allclose(a, 0) for a in leaves)


@pytest.mark.slow
def test_two_learner_processes_equal_one_process(tmp_path, single_device):
  address = f"localhost:{portpicker.pick_unused_port()}"
  out = tmp_path / "two.npz"
  procs = [_run_worker(out, "--coordinator", address, "--num_processes", 2, "--process_id", pid, wait=False)
           for pid in (0, 1)]
  for proc in procs:
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output
  facts, leaves = _load(out)
  assert facts["processes"] == 2 and facts["devices"] == 2 and facts["cache_size"] == 1
  for ours, reference in zip(leaves, single_device[1]):
    np.testing.assert_allclose(ours, reference, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_two_embedded_processes_make_the_same_learner_calls(tmp_path):
  """Two runner processes share one learner mesh; with n-step 3 and prioritized replay each
  decides its learner calls from env steps, so both make the same calls and end equal,
  and each updates only the priorities of the rows it sampled."""
  address = f"localhost:{portpicker.pick_unused_port()}"
  args = ["--steps", "3000", "--eval_every", "1000", "--eval_episodes", "3", "--min_replay_size", "500",
          "--hidden_sizes", "32,32", "--deterministic", "--prioritized", "--n_step", "3", "--progress_seconds", "0",
          "--coordinator_address", address, "--num_processes", "2"]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  procs = [subprocess.Popen([sys.executable, "-m", "launch.train", *args, "--process_id", str(pid),
                             "--run_dir", str(tmp_path / f"p{pid}")], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for pid in (0, 1)]
  for proc in procs:
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output[-3000:]
  summaries = [json.load(open(tmp_path / f"p{pid}" / "summary.json")) for pid in (0, 1)]
  assert summaries[0]["learner_processes"] == 2 and summaries[0]["learner_steps"] > 0
  assert summaries[0]["learner_steps"] == summaries[1]["learner_steps"]
  assert summaries[0]["params_digest"] == summaries[1]["params_digest"]
