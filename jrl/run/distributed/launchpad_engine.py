"""The Launchpad engine (the full stack): nodes served by courier, replay by a Reverb node.

`LAUNCHPAD` is what `program.build_program` gives every node: courier clients become `Handle`s,
the Reverb node's client a `ReverbReplayClient`, and the stop is Launchpad's.
"""

from jrl import compat

compat.import_jax_probability()  # before anything imports TensorFlow

import os
from typing import Any

import launchpad as lp

from jrl.experiment.builder import build_agent_parts, example_item
from jrl.experiment.config import ExperimentConfig
from jrl.experiment.files import CHECKPOINTS_DIR
from jrl.replay import reverb_replay

REVERB_SCRATCH = ".reverb"  # under checkpoints/: where the replay node writes Reverb checkpoints


class CourierHandle:
  """A courier client as a `jrl.run.distributed.engine.Handle`."""

  def __init__(self, client):
    self._client = client

  @property
  def address(self) -> str:
    return str(getattr(self._client, "address", "?"))

  def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
    return getattr(self._client, method)(*args, **kwargs)

  def future(self, method: str, *args: Any, **kwargs: Any):
    return getattr(self._client.futures, method)(*args, **kwargs)


class LaunchpadEngine:
  """The engine's services to nodes that Launchpad runs (`jrl.run.distributed.engine.Engine`)."""

  name = "launchpad"

  def handle(self, raw) -> CourierHandle:
    return CourierHandle(raw)

  def replay(self, raw) -> reverb_replay.ReverbReplayClient:
    return reverb_replay.ReverbReplayClient(raw)

  def stop_event(self):
    return lp.stop_event()  # Launchpad's worker manager is only known to the node's own thread

  def stop(self) -> None:
    lp.stop()

  def wait_for_stop(self) -> None:
    lp.wait_for_stop()


LAUNCHPAD = LaunchpadEngine()


def reverb_checkpointer(run_dir: str, restore_from):
  """The replay node's checkpointer: writes under checkpoints/.reverb (the learner moves each
  checkpoint into the run's own); a resumed program's tables start from `restore_from`."""
  return reverb_replay.reverb.checkpointers.DefaultCheckpointer(
      os.path.join(run_dir, CHECKPOINTS_DIR, REVERB_SCRATCH), fallback_checkpoint_path=restore_from)


def make_replay_tables(exp: ExperimentConfig, agent_cfg):
  """The replay node's tables: `reverb_replay.replay_tables`, as the embedded runner's, sampled by
  the learner's processes, each its share of the batch."""
  parts = build_agent_parts(exp.agent, exp.env, agent_cfg)
  return reverb_replay.replay_tables(parts.replay_spec, example_item(parts, agent_cfg), exp.updates_per_call,
                                     agent_cfg.batch_size // exp.num_processes, exp.prefetch,
                                     samplers=exp.num_processes)
