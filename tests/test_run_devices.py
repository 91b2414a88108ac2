"""Every run names the devices of its parts: summary.json's details["devices"] (role -> device names)
and report.md's devices line. The embedded runner's are tested in tests/test_actor_device.py; here
the names themselves, a device run's and a distributed run's report (its placement as a GPU host's
would be, from jrl.accelerators: this host has no GPU)."""

import json
import os
import types

import pytest

from jrl.accelerators import Accelerators, describe, place_roles
from jrl.agents import dqn, ppo
from jrl.experiment import report
from jrl.experiment.config import ExperimentConfig


def _device(platform, index, version=""):
  return types.SimpleNamespace(platform=platform, id=index, client=types.SimpleNamespace(platform_version=version))


def test_devices_are_named_by_platform_and_id_a_gpu_by_its_plugin():
  assert report.device_name(_device("cpu", 0)) == "cpu:0"
  assert report.device_name(_device("gpu", 1, "PJRT C API\ncuda 12030")) == "cuda:1"
  assert report.device_name(_device("gpu", 0, "rocm 60100")) == "rocm:0"
  assert report.device_name(_device("tpu", 3)) == "tpu:3"
  assert report.device_name(types.SimpleNamespace(platform="gpu", id=2)) == "cuda:2"  # no client to ask


def test_the_devices_line_names_each_role_once_and_its_notes():
  assert report.devices_text({"learner": ["cuda:0", "cuda:1"], "actor": ["cpu:0"], "evaluator": ["cuda:0"]},
                             {"actor": "--actor_device auto"}) == \
      "learner: cuda:0, cuda:1; actor: cpu:0 (--actor_device auto); evaluator: cuda:0"
  assert report.devices_text({"actor": ["cpu"] * 8, "inference": ["cuda:1", "cuda:2"]}) == \
      "actor: cpu x8; inference: cuda:1, cuda:2"
  assert report.devices_text({"loop": ["cpu:0"]}) == "loop: cpu:0"


@pytest.mark.needs_gymnax
def test_a_device_run_names_its_loops_devices(tmp_path):
  from jrl.run.device.runner import run_device
  exp = ExperimentConfig(agent="ppo", env="gymnax:CartPole-v1", backend="device", steps=2_048, eval_every=1_024,
                         eval_episodes=2, progress_seconds=0, run_dir=str(tmp_path / "run"))
  summary = run_device(exp, ppo.Config())
  assert summary["details"]["devices"] == {"loop": ["cpu:0"]}
  with open(tmp_path / "run" / "summary.json") as f:
    assert json.load(f)["details"]["devices"] == {"loop": ["cpu:0"]}
  assert "\n## devices\n\nloop: cpu:0\n" in (tmp_path / "run" / "report.md").read_text()


@pytest.mark.needs_reverb  # jrl.run.distributed imports launchpad
def test_a_distributed_runs_report_shows_the_devices_its_summary_names(tmp_path):
  from jrl.run.distributed import program_report as program
  from jrl.run.distributed.node_io import Session
  run_dir = str(tmp_path)
  exp = ExperimentConfig(agent="dqn", env="CartPole-v1", distributed=True, num_actors=2, inference="server",
                         run_dir=run_dir)
  # A host with two GPUs: the learner on the first, the inference server on the second.
  devices = describe(place_roles(Accelerators("cuda", 2), inference_servers=1, actors=2))
  summary = {"details": {}, "wall_seconds": 1.0, "actor_steps": 0}
  _, _, details = program.run_report(run_dir, Session(run_dir), exp, dqn.Config(), summary, None,
                                         devices=devices)
  assert details["devices"] == devices
  text = open(os.path.join(run_dir, "report.md")).read()
  assert ("\n## devices\n\ncounter: cpu; replay: cpu; learner: cuda:0; inference: cuda:1; actor: cpu x2; "
          "evaluator: cpu\n") in text
  # A CPU host's run: every role on the CPU.
  devices = describe(place_roles(Accelerators(), actors=2))
  program.run_report(run_dir, Session(run_dir), exp, dqn.Config(), summary, None, devices=devices)
  assert "counter: cpu; replay: cpu; learner: cpu; actor: cpu x2; evaluator: cpu\n" in \
      open(os.path.join(run_dir, "report.md")).read()
