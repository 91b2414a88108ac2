"""Frame-shared pixel replay (jrl.replay.frames): stacks of frames stored once per frame give the
same sampled bytes as stored stacks, in the seeded buffer and in Reverb, for n-step transitions,
on-policy trajectories and R2D2 sequences, across real Atari episode boundaries; a restored
replay continues exactly; the ring grows rather than overwrite a frame an item holds."""

import dataclasses
import pickle

import jax
import numpy as np
import pytest

from jrl import envs
from jrl.replay.frames import FrameEncoder, FrameSharingAdder, FrameStore
from jrl.replay.kinds import ReplayedSequences, TrajectoryQueue, Transitions
from jrl.replay.local import LocalReplay
from jrl.replay.sequence_adder import START_STATE_KEY
from jrl.replay.spec import ReplaySpec
from jrl.types import Transition

NUM_ENVS, STEPS, K = 2, 500, 4
KINDS = {"n-step transitions": (Transitions(n_step=3, discount=0.9), 4),
         "trajectories": (TrajectoryQueue(sequence_length=8), 1),
         "R2D2 sequences": (ReplayedSequences(sequence_length=10, sequence_period=5), 1)}


@pytest.fixture(scope="module")
def breakout_steps():
  """500 vector steps of two ALE Breakout envs (the atari preset: 84x84x4 uint8 stacks, a lost
  life ends the episode and the next continues the game) under seeded random actions."""
  env = envs.make_vector_env("ALE/Breakout-v5", NUM_ENVS, seed=0)
  rng = np.random.default_rng(0)
  obs, _ = env.reset(seed=0)
  steps = []
  for t in range(STEPS):
    action = rng.integers(0, 4, NUM_ENVS)
    next_obs, reward, terminated, truncated, info = env.step(action)
    extras = {START_STATE_KEY: np.full((NUM_ENVS, 3), t, np.float32)}
    steps.append((obs, action.astype(np.int32), reward, terminated, truncated, next_obs, info, extras))
    obs = next_obs
  env.close()
  return steps


def _spec(kind, block_size, frame_stack, max_size=400, prioritized=False):
  return ReplaySpec(block_size=block_size, max_size=max_size, min_size=16, samples_per_insert=2.0,
                    prioritized=prioritized, kind=kind, frame_stack=frame_stack)


def _leaves_equal(a, b) -> None:
  la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
  assert len(la) == len(lb)
  for x, y in zip(la, lb):
    assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y)


def _batches(replay: LocalReplay, steps, updates: int):
  out = []
  for obs, action, reward, terminated, truncated, next_obs, info, extras in steps:
    replay.add(obs, action, reward, terminated, truncated, next_obs, info, extras=extras)
    while replay.updates_due() >= updates:
      out.append(replay.sample(updates))
  return out


def test_the_episodes_cross_boundaries(breakout_steps):
  ends = sum(int(np.sum(t[3] | t[4])) for t in breakout_steps)
  assert ends >= 4, "the stream should hold several episode starts (lost lives)"


@pytest.mark.parametrize("name", list(KINDS))
def test_seeded_buffer_samples_the_same_bytes_as_stored_stacks(breakout_steps, name):
  kind, block = KINDS[name]
  updates = 1 if isinstance(kind, TrajectoryQueue) else 2
  prioritized = isinstance(kind, Transitions)
  shared = LocalReplay(_spec(kind, block, K, prioritized=prioritized), NUM_ENVS, seed=3, batch_size=4)
  stacks = LocalReplay(_spec(kind, block, 0, prioritized=prioritized), NUM_ENVS, seed=3, batch_size=4)
  a, b = _batches(shared, breakout_steps, updates), _batches(stacks, breakout_steps, updates)
  assert len(a) == len(b) >= 10
  for x, y in zip(a, b):
    _leaves_equal(x, y)
  assert a[-1].transitions.observation.shape[-3:] == (84, 84, K)
  # Stored: one frame per env step (and a stack's worth per episode start), ids in place of stacks.
  store = shared._buffer._frames
  env_steps, starts = STEPS * NUM_ENVS, sum(int(np.sum(t[3] | t[4])) for t in breakout_steps) + NUM_ENVS
  assert env_steps <= store.frames_added <= env_steps + (K + 1) * starts
  assert shared._buffer._storage.observation.dtype == np.int64


def test_seeded_buffer_restored_mid_stream_continues_exactly(breakout_steps, monkeypatch):
  import jrl.replay.spec
  monkeypatch.setattr(jrl.replay.spec, "MIN_CAPACITY", 64)  # a ring of ~210 frames
  kind, block = KINDS["n-step transitions"]
  spec = _spec(kind, block, K, max_size=200)  # a small replay: items leave and the frame ring wraps
  replay = LocalReplay(spec, NUM_ENVS, seed=5, batch_size=4)
  half = STEPS // 2
  _batches(replay, breakout_steps[:half], 2)
  saved = pickle.loads(pickle.dumps(replay.state()))
  rest = _batches(replay, breakout_steps[half:], 2)
  resumed = LocalReplay(spec, NUM_ENVS, seed=5, batch_size=4)
  resumed.restore(saved)
  again = _batches(resumed, breakout_steps[half:], 2)
  assert len(rest) == len(again) >= 10
  for x, y in zip(rest, again):
    _leaves_equal(x, y)
  assert replay._buffer._frames.frames_added > replay._buffer._frames.capacity  # the ring wrapped


def test_a_saved_stacks_replay_is_refused_by_a_frame_sharing_one(breakout_steps):
  kind, block = KINDS["n-step transitions"]
  old = LocalReplay(_spec(kind, block, 0), NUM_ENVS, seed=0, batch_size=4)
  _batches(old, breakout_steps[:50], 2)
  with pytest.raises(ValueError, match="frame sharing"):
    LocalReplay(_spec(kind, block, K), NUM_ENVS, seed=0, batch_size=4).restore(old.state())


@pytest.mark.needs_reverb
@pytest.mark.parametrize("name", list(KINDS))
def test_reverb_items_reference_frame_steps_and_sample_the_same_bytes(breakout_steps, name):
  """A queue table (FIFO: items come back in order) filled through the real writer with and
  without frame sharing: every item's bytes are the same."""
  from jrl.replay import reverb_replay
  from jrl.replay.adders import make_block_writer
  kind, block = KINDS[name]
  obs = np.zeros((84, 84, K), np.uint8)
  step = Transition(obs, np.int32(0), np.float32(0), np.float32(0), obs)
  extras = (lambda: {START_STATE_KEY: np.zeros(3, np.float32)}) if isinstance(kind, ReplayedSequences) else dict
  items = []
  for frame_stack in (K, 0):
    spec = _spec(kind, block, frame_stack, max_size=100_000)
    example = kind.example_item(spec, step, extras)
    server = reverb_replay.start_server([reverb_replay.reverb.Table.queue(
        reverb_replay.TABLE, 100_000, signature=reverb_replay.item_signature(example, frame_stack))])
    try:
      address = f"localhost:{server.port}"
      client = reverb_replay.reverb.Client(address)
      writer = reverb_replay.ReverbItemWriter(client, **reverb_replay.frame_options(spec, NUM_ENVS))
      blocks, adder = make_block_writer(spec, writer), spec.make_adder(NUM_ENVS)
      for obs_t, action, reward, terminated, truncated, next_obs, info, step_extras in breakout_steps:
        bootstrap = envs.final_observations(next_obs, terminated | truncated, info)
        blocks.add(adder.add(obs_t, action, reward, terminated, truncated, bootstrap,
                             step_extras if isinstance(kind, ReplayedSequences) else None))
      writer.flush()
      size = int(client.server_info()[reverb_replay.TABLE].current_size)
      items.append(reverb_replay.ReverbItemSampler(address, size, example, frame_stack=frame_stack).sample().data)
      writer.close()
    finally:
      server.stop()
  shared, stacks = items
  _leaves_equal(shared, stacks)
  assert shared.observation.shape[0] >= 50 and shared.observation.dtype == np.uint8


def test_encoder_ids_follow_each_envs_stream():
  """Hand-computed ids (from the encoder's base): a reset stack gets a new id per frame (even when
  padded with one frame); the next step's stack shifts by one frame and adds one id; a repeated
  stack adds none. Two encoders (env groups, or sessions) never give the same id."""
  f = [np.full((2, 2), v, np.uint8) for v in range(10)]
  stack = lambda *frames: np.stack(frames, -1)[None]  # one env
  encoder = FrameEncoder(3)
  ids, new, frames = encoder.encode(stack(f[0], f[0], f[0]))  # reset padding: the first frame three times
  base = int(ids[0, 0])
  assert (ids - base).tolist() == [[0, 1, 2]] and (new - base).tolist() == [0, 1, 2]
  assert [x[0, 0] for x in frames] == [0, 0, 0]
  ids, new, _ = encoder.encode(stack(f[0], f[0], f[0]))
  assert (ids - base).tolist() == [[0, 1, 2]] and new.tolist() == []
  ids, new, frames = encoder.encode(stack(f[0], f[0], f[1]))
  assert (ids - base).tolist() == [[1, 2, 3]] and (new - base).tolist() == [3] and frames[0, 0, 0] == 1
  ids, new, _ = encoder.encode(stack(f[5], f[6], f[7]))  # a new episode
  assert (ids - base).tolist() == [[4, 5, 6]] and (new - base).tolist() == [4, 5, 6]
  other = FrameEncoder(3).encode(stack(f[1], f[2], f[3]))[0]
  assert not set(other.ravel().tolist()) & set(range(base, base + 7))


def test_frame_store_grows_rather_than_overwrite_a_held_frame():
  store = FrameStore(capacity=8)
  frame = lambda i: np.full((1, 2), i, np.uint8)
  store.add(np.arange(4), np.stack([frame(i) for i in range(4)]))
  store.item_added(0, store.references(np.array([0, 1, 2, 3])))  # item 0 holds frames 0-3
  store.add(np.arange(4, 12), np.stack([frame(i) for i in range(4, 12)]))  # would overwrite 0-3
  assert store.capacity > 8
  assert store.decode(store.references(np.array([[0, 1, 2, 3]])))[0, 0, 1].tolist() == [0, 1, 2, 3]
  store.items_before(1)  # item 0 left replay: its frames may go
  grown = store.capacity
  store.add(np.arange(12, 12 + grown), np.stack([frame(i % 256) for i in range(12, 12 + grown)]))
  assert store.capacity == grown
  with pytest.raises(KeyError, match="frame id 0"):
    store.references(np.array([0]))


def test_atari_runs_share_frames_and_other_envs_do_not():
  from jrl.agents import dqn
  from jrl.experiment.builder import build_agent_parts
  assert build_agent_parts("dqn", "ALE/Pong-v5", dqn.Config()).replay_spec.frame_stack == K
  assert build_agent_parts("dqn", "MinAtar/Breakout-v1", dqn.Config()).replay_spec.frame_stack == 0
  assert build_agent_parts("dqn", "CartPole-v1", dqn.Config()).replay_spec.frame_stack == 0
  spec = _spec(Transitions(), 8, 0)
  assert isinstance(dataclasses.replace(spec, frame_stack=K).make_adder(2), FrameSharingAdder)
  with pytest.raises(Exception, match="frame_stack"):
    dataclasses.replace(spec, frame_stack=1)


@pytest.mark.slow
def test_a_deterministic_atari_run_learns_the_same_bytes_with_shared_frames(tmp_path, monkeypatch):
  """The embedded --deterministic DQN on ALE Pong: frame sharing on (the default) and off end with
  the same parameter digest. (Pong: its evaluation game ends within about 1,000 steps, where an
  untrained greedy Breakout policy that never serves plays until ALE's time limit.)"""
  from jrl.agents import dqn
  from jrl.experiment import builder
  from jrl.experiment.config import ExperimentConfig
  from jrl.run.embedded import run
  cfg = dqn.Config(batch_size=8, min_replay_size=64, max_replay_size=256, samples_per_insert=1.0, block_size=4,
                   n_step=3, reward_clip=1.0)
  digests = []
  for share in (True, False):
    if not share:
      monkeypatch.setattr(builder.pixel_envs, "frame_stack", lambda env_id: 0)
    assert builder.build_agent_parts("dqn", "ALE/Pong-v5", cfg).replay_spec.frame_stack == (K if share else 0)
    exp = ExperimentConfig(agent="dqn", env="ALE/Pong-v5", seed=0, steps=400, num_envs=2, deterministic=True,
                           eval_every=400, eval_episodes=1, run_dir=str(tmp_path / f"share-{share}"),
                           progress_seconds=0)
    digests.append(run(exp, cfg)["params_digest"])
  assert digests[0] == digests[1]


@pytest.mark.slow
@pytest.mark.needs_reverb
def test_a_reverb_atari_run_resumes_with_shared_frames(tmp_path):
  """A Reverb (not --deterministic) Atari run, then `--resume` to more steps: the resumed session's
  writer never had the frames the rows in flight at the checkpoint name; they are dropped with the
  adders' windows and the run goes on to its new budget (it hung on the learner's schedule before)."""
  import json
  import subprocess
  import sys
  run_dir = tmp_path / "pong"
  train = [sys.executable, "-m", "launch.train"]
  first = subprocess.run(train + ["--agent", "dqn", "--env", "ALE/Pong-v5", "--steps", "600", "--num_envs", "4",
                                  "--batch_size", "8", "--min_replay_size", "64", "--max_replay_size", "1000",
                                  "--samples_per_insert", "1", "--eval_every", "600", "--eval_episodes", "1",
                                  "--run_dir", str(run_dir)], capture_output=True, text=True, timeout=600)
  assert first.returncode == 0, first.stderr[-3000:]
  resumed = subprocess.run(train + ["--resume", str(run_dir), "--steps", "1000"], capture_output=True, text=True,
                           timeout=600)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  summary = json.loads((run_dir / "summary.json").read_text())
  assert summary["actor_steps"] >= 1000 and summary["resumed"]
