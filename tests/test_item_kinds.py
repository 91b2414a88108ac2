"""Replay item kinds (`jrl.replay.kinds`): one composition for every path. The same env steps
stored through the embedded runner's adder, `LocalReplay` and the device window give the same
(clipped) rewards; a device run clips what it stores and reports game scores; bad kinds are one
line naming the field; no shell asks which kind it has; run directories written before the
kinds resume to the same bytes as the code that wrote them."""

import csv
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from typing import Any, Dict, NamedTuple, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jrl.agents import dqn, get_agent, ppo
from jrl.errors import ConfigError
from jrl.replay.kinds import ItemKind, ReplayedSequences, TrajectoryQueue, Transitions
from jrl.replay.local import LocalReplay
from jrl.replay.sequence_adder import START_STATE_KEY
from jrl.replay.spec import ReplaySpec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OLD_RUNS = os.path.join(ROOT, "tests", "data", "pre_item_kinds")

NUM_ENVS, STEPS, CORE = 3, 24, 4


class Step(NamedTuple):
  """What the device loop hands `ItemKind.device_add` of an env step (a StepResult's fields)."""
  reward: jax.Array
  terminated: jax.Array
  truncated: jax.Array
  final_observation: jax.Array


def _steps(seed: int = 0):
  """Env steps whose observations name (env, step), with rewards up to 5 in size and episode ends."""
  rng = np.random.default_rng(seed)
  terminated = rng.random((STEPS, NUM_ENVS)) < 0.12
  truncated = (rng.random((STEPS, NUM_ENVS)) < 0.08) & ~terminated
  reward = rng.uniform(-5, 5, size=(STEPS, NUM_ENVS)).astype(np.float32)
  cores = rng.normal(size=(STEPS, NUM_ENVS, CORE)).astype(np.float32)
  for t in range(STEPS):
    obs = np.stack([np.array([e, t], np.float32) for e in range(NUM_ENVS)])
    yield (obs, np.full(NUM_ENVS, t % 2, np.int32), reward[t], terminated[t], truncated[t], obs + np.float32(0.5),
           {START_STATE_KEY: cores[t]})


def _by_step(rows) -> Dict[Tuple[int, int], Any]:
  """Stored rows keyed by the (env, step) of the step they hold: a transition's first step (its
  n-step reward), or every step of a sequence (its reward at that step)."""
  out = {}
  obs, reward = np.asarray(rows.observation), np.asarray(rows.reward)
  if obs.ndim == 2:  # transitions [R, 2]
    for o, r in zip(obs, reward):
      out[(int(o[0]), int(o[1]))] = float(r)
  else:              # sequences [R, T, 2]
    for seq_obs, seq_reward in zip(obs, reward):
      for o, r in zip(seq_obs, seq_reward):
        key = (int(o[0]), int(o[1]))
        assert out.setdefault(key, float(r)) == float(r)  # overlapping sequences agree
  return out


def _through_adder(kind: ItemKind, clip_first: bool = False) -> Dict[Tuple[int, int], Any]:
  adder = kind.make_adder(NUM_ENVS)
  rows = []
  for obs, action, reward, terminated, truncated, final, extras in _steps():
    if clip_first:
      reward = np.clip(reward, -1.0, 1.0)
    out = adder.add(obs, action, reward, terminated, truncated, final, extras)
    if len(out.reward):
      rows.append(out)
  return _by_step(jax.tree_util.tree_map(lambda *xs: np.concatenate(xs), *rows))


def _through_local_replay(replay: LocalReplay) -> Dict[Tuple[int, int], Any]:
  for obs, action, reward, terminated, truncated, final, extras in _steps():
    replay.add(obs, action, reward, terminated, truncated, final, {"final_obs": final}, extras)
  buffer = replay.state()["buffer"]  # what the seeded buffer holds: items [I, block or T, ...]
  stored = jax.tree_util.tree_map(lambda x: x[:buffer["_inserted"]], buffer["_storage"])
  if isinstance(replay.spec.kind, Transitions):  # blocks of transitions: their rows
    stored = jax.tree_util.tree_map(lambda x: x.reshape((-1,) + x.shape[2:]), stored)
  return _by_step(stored)


def _through_device_window(spec: ReplaySpec) -> Dict[Tuple[int, int], Any]:
  kind = spec.kind
  first = next(_steps())
  start = jax.ShapeDtypeStruct((NUM_ENVS, CORE), jnp.float32)
  window, _ = kind.device_init(spec, jnp.asarray(first[0]), jnp.asarray(first[1]), lambda: {START_STATE_KEY: start})
  add = jax.jit(kind.device_add)
  rows = []
  for obs, action, reward, terminated, truncated, final, extras in _steps():
    step = Step(*map(jnp.asarray, (reward, terminated, truncated, final)))
    window, row, valid = add(window, jnp.asarray(obs), jnp.asarray(action), step,
                             {k: jnp.asarray(v) for k, v in extras.items()})
    if bool(valid):
      rows.append(jax.tree_util.tree_map(np.asarray, row))
  stacked = jax.tree_util.tree_map(lambda *xs: np.concatenate(xs), *rows)
  if isinstance(kind, TrajectoryQueue):  # one step per row: the loop's rollouts stack them into trajectories
    stacked = jax.tree_util.tree_map(lambda x: x[:, None], stacked)
  return _by_step(stacked)


def _r2d2_spec() -> ReplaySpec:
  # R2D2's config has no reward_clip: the kind is named with it directly, as an agent of one's own would.
  return ReplaySpec(kind=ReplayedSequences(sequence_length=5, sequence_period=2, burn_in=1, reward_clip=1.0),
                    block_size=1, max_size=1000, min_size=1)


CASES = {
    "dqn": lambda: dqn.Config(n_step=3, discount=0.9, reward_clip=1.0, block_size=1, min_replay_size=1),
    "ppo": lambda: ppo.Config(sequence_length=4, batch_size=8, reward_clip=1.0),
    "r2d2": None,
}


@pytest.mark.parametrize("agent", sorted(CASES))
def test_the_runner_adder_local_replay_and_device_window_store_the_same_clipped_rewards(agent):
  """Rewards up to 5 in size, reward_clip 1: every path stores what the kind's unclipped adder
  stores of pre-clipped rewards (n-step sums of clipped rewards for DQN), and none stores the
  env's own (LocalReplay and the device window used to)."""
  if CASES[agent] is None:
    spec = _r2d2_spec()
    local = LocalReplay(spec, NUM_ENVS, seed=0, batch_size=4)
  else:
    cfg = CASES[agent]()
    spec = get_agent(agent).make_replay_spec(cfg)  # what the runner's builder and the device loop use
    local = LocalReplay.for_agent(cfg, num_envs=NUM_ENVS, seed=0)
  assert spec.kind.reward_clip == 1.0
  plain = dataclasses.replace(spec.kind, reward_clip=0.0)
  expected = _through_adder(plain, clip_first=True)
  assert expected != _through_adder(plain)  # clipping changes what is stored here
  runner = _through_adder(spec.kind)
  stored = _through_local_replay(local)
  device = _through_device_window(spec)
  assert runner == expected
  assert stored == expected
  assert len(device) >= NUM_ENVS * (STEPS - 8) and all(device[k] == pytest.approx(expected[k], abs=1e-5)
                                                         for k in device), agent
  if agent != "dqn":  # one step's reward per entry
    assert max(abs(r) for r in stored.values()) <= 1.0


SCALED_CARTPOLE = '''
import gymnax


def cartpole_x10():
  """gymnax CartPole with 10 times its rewards: clipping to 1 shows."""
  env, params = gymnax.make("CartPole-v1")

  class Scaled(type(env)):
    def step_env(self, key, state, action, params):
      obs, state, reward, done, info = super().step_env(key, state, action, params)
      return obs, state, 10.0 * reward, done, info

  return Scaled(), params
'''


@pytest.mark.needs_gymnax
def test_a_device_run_with_reward_clip_stores_clipped_rewards_and_reports_game_scores(tmp_path, monkeypatch):
  from jrl.run.device.loop import DeviceLoop, build_device_parts, make_plan
  from jrl.run.device.runner import run_device
  from jrl.experiment.checkpoint import Checkpointer, checkpoint_to_resume
  from jrl.experiment.config import ExperimentConfig
  from jrl.gymnax_envs import GymnaxVecEnv
  from jrl.learners import sharding

  package = tmp_path / "kinds_envs"
  package.mkdir()
  (package / "__init__.py").write_text("")
  (package / "scaled.py").write_text(SCALED_CARTPOLE)
  monkeypatch.syspath_prepend(str(tmp_path))
  env_id = "gymnax:kinds_envs.scaled:cartpole_x10"
  cfg = dqn.Config(reward_clip=1.0, n_step=1, min_replay_size=256, batch_size=32)
  exp = ExperimentConfig(agent="dqn", env=env_id, backend="device", seed=0, steps=2_000, eval_every=1_000,
                         eval_episodes=1, num_envs=8, run_dir=str(tmp_path / "run"), progress_seconds=0)
  summary = run_device(exp, cfg)
  # Evaluation plays the env's own rewards: game scores, 10 a step.
  assert summary["eval_return"] >= 10 and summary["eval_return"] % 10 == 0, summary
  with open(tmp_path / "run" / "metrics" / "evaluator.csv") as f:
    evals = [float(row["eval_return"]) for row in csv.DictReader(f)]
  assert len(evals) == 2 and all(r >= 10 and r % 10 == 0 for r in evals), evals
  # What the ring stored: the last checkpoint's carry, unflattened as the run's loop lays it out.
  env = GymnaxVecEnv(env_id)
  parts = build_device_parts("dqn", env, cfg)
  mesh = sharding.make_mesh(1)
  loop = DeviceLoop(exp, cfg, env, parts, mesh, make_plan(exp, parts, cfg, 1))
  treedef = jax.tree_util.tree_structure(jax.eval_shape(loop.init, exp.seed))
  newest = checkpoint_to_resume(str(tmp_path / "run"), exp.steps + 1)  # the one a longer run would resume
  leaves = Checkpointer.read_run_state(newest)["carry"]
  ring = jax.tree_util.tree_unflatten(treedef, leaves).ring
  stored = np.asarray(ring.data.reward)[:min(int(ring.rows), len(ring.data.reward))]
  # gymnax CartPole's reward is 1 - (previous state terminal), here 10 or 0: stored clipped, 1 or 0.
  assert stored.size and stored.max() == 1.0 and set(np.unique(stored).tolist()) <= {0.0, 1.0}


def _train(args, tmp_path, env_extra=None):
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), ROOT]), **(env_extra or {})}
  return subprocess.run([sys.executable, "-m", "launch.train", *args, "--run_dir", str(tmp_path / "never")],
                        cwd=ROOT, env=env, text=True, capture_output=True, timeout=300)


AGENT_MODULE = '''
from jrl.agents.dqn import Config, make_learner, make_networks, make_policy  # noqa: F401
from jrl.replay.kinds import ReplayedSequences
from jrl.replay.spec import ReplaySpec


def make_replay_spec(cfg):
  return ReplaySpec(kind={kind}, block_size=cfg.block_size, max_size=cfg.max_replay_size,
                    min_size=cfg.min_replay_size)
'''

BAD_KINDS = {
    "unknown kind": ('"episodes"', "kind: unknown replay item kind 'episodes': name one of Transitions, "
                                   "TrajectoryQueue, ReplayedSequences (jrl.replay.kinds), or a subclass of ItemKind"),
    "length <= burn-in": ("ReplayedSequences(sequence_length=4, sequence_period=2, burn_in=4)",
                          "sequence_length: must be > burn_in (4), got 4"),
    "period > length": ("ReplayedSequences(sequence_length=4, sequence_period=6)",
                        "sequence_period: must be <= sequence_length (4), got 6"),
}


@pytest.mark.parametrize("case", sorted(BAD_KINDS))
def test_an_agent_naming_a_bad_kind_is_one_line_naming_the_field(case, tmp_path):
  kind, message = BAD_KINDS[case]
  package = tmp_path / "mine"
  package.mkdir()
  (package / "__init__.py").write_text("")
  (package / "agent.py").write_text(AGENT_MODULE.format(kind=kind))
  out = _train(["--agent", "mine.agent", "--deterministic", "--steps", "100"], tmp_path)
  assert out.returncode == 2 and out.stderr.strip().splitlines() == [f"python -m launch.train: error: {message}"]
  assert not (tmp_path / "never").exists()


BAD_FLAGS = {
    "r2d2 length <= burn-in": (["--agent", "r2d2", "--sequence_length", "4", "--burn_in", "4"],
                               "sequence_length: must be > burn_in (4), got 4"),
    "r2d2 period > length": (["--agent", "r2d2", "--sequence_period", "30"],
                             "sequence_period: must be <= sequence_length (20), got 30"),
    "ppo no steps": (["--agent", "ppo", "--sequence_length", "0"], "sequence_length: must be > 0, got 0"),
    "dqn n_step": (["--agent", "dqn", "--n_step", "0"], "n_step: must be > 0, got 0"),
    "impala reward_clip": (["--agent", "impala", "--reward_clip", "-1"],
                           "reward_clip: must be >= 0 (0: off), got -1.0"),
}


@pytest.mark.parametrize("case", sorted(BAD_FLAGS))
def test_kind_options_that_do_not_fit_are_one_line_naming_the_flag(case, tmp_path):
  args, message = BAD_FLAGS[case]
  out = _train([*args, "--deterministic"], tmp_path)
  assert out.returncode == 2 and out.stderr.strip().splitlines() == [f"python -m launch.train: error: {message}"]


def test_kinds_check_their_fields_and_the_old_names_still_read():
  with pytest.raises(ConfigError, match=r"^kind: unknown replay item kind 'episodes'"):
    ReplaySpec(kind="episodes")
  for make, message in [(lambda: Transitions(n_step=0), "n_step: must be > 0, got 0"),
                        (lambda: Transitions(reward_clip=-1.0), "reward_clip: must be >= 0 (0: off), got -1.0"),
                        (lambda: TrajectoryQueue(sequence_length=0), "sequence_length: must be > 0, got 0"),
                        (lambda: ReplayedSequences(sequence_length=5, sequence_period=2, burn_in=-1),
                         "burn_in: must be >= 0, got -1")]:
    with pytest.raises(ConfigError) as raised:
      make()
    assert str(raised.value) == message
  # Specs written before item kinds (the fields that named the kind, and the flags they read).
  queue = ReplaySpec(block_size=1, max_size=10, min_size=1, sequence_length=5)
  assert queue.kind == TrajectoryQueue(sequence_length=5) and queue.sequences and not queue.replayed_sequences
  assert queue.sequence_length == 5 and dataclasses.replace(queue, max_size=20).kind == queue.kind
  replayed = ReplaySpec(block_size=1, max_size=10, min_size=1, replay_sequence_length=8, replay_sequence_period=4)
  assert replayed.kind == ReplayedSequences(sequence_length=8, sequence_period=4) and replayed.replayed_sequences
  assert (replayed.replay_sequence_length, replayed.replay_sequence_period, replayed.sequence_length) == (8, 4, 0)
  assert ReplaySpec().kind == Transitions() and not ReplaySpec().sequences
  with pytest.raises(ConfigError, match="^kind: name the item kind, or the fields"):
    ReplaySpec(kind=Transitions(), sequence_length=5)
  # The agents name theirs from their configs.
  assert ppo.Config(sequence_length=16, reward_clip=1.0).replay_spec().kind == TrajectoryQueue(sequence_length=16,
                                                                                               reward_clip=1.0)
  assert dqn.Config(n_step=2).replay_spec().kind == Transitions(n_step=2, discount=0.99)


# The flags of item kinds and the implicit protocol of getattr(agent config, "field", default).
ASKS_WHICH_KIND = re.compile(r'\.(sequences|replayed_sequences|replay_sequence_length|replay_sequence_period)\b'
                             r'|spec\.sequence_length|plan\.on_policy|getattr\([a-z_]*(cfg|config)[a-z_]*, "')


def test_no_shell_asks_which_kind_it_has():
  """Outside jrl/replay/ (the kinds) and the agents (that name them), nobody reads a kind's flags
  or an agent config's fields by getattr with a default."""
  hits = []
  for top in ("jrl", "launch"):
    for folder, _, names in os.walk(os.path.join(ROOT, top)):
      rel = os.path.relpath(folder, ROOT)
      if rel.startswith((os.path.join("jrl", "replay"), os.path.join("jrl", "agents"))):
        continue
      for name in names:
        if name.endswith(".py"):
          with open(os.path.join(folder, name)) as f:
            hits += [f"{rel}/{name}:{i}: {line.strip()}" for i, line in enumerate(f, 1)
                     if ASKS_WHICH_KIND.search(line)]
  assert hits == []


# Run directories written by the code before item kinds (tests/data/pre_item_kinds, with .venv's
# JAX) and the steps to resume them to: env steps, learner steps. What that code ends with is not a
# digest recorded here: XLA's CPU kernels round differently on another processor (the digests
# recorded on one machine missed on the next, for the code that wrote them too), so the test runs
# that code, from git, on this machine.
WRITER = "fb2477e8df6dbdb12173716936c7bea6c1571825"
OLD_RUNS_JAX = "0.6.2"
OLD_RUN_EXTENDED = {"ppo": (4096, 128), "r2d2": (2048, 504), "device-r2d2": (2048, 504)}


@pytest.mark.parametrize("name", [pytest.param("ppo"), pytest.param("r2d2"),
                                  pytest.param("device-r2d2", marks=pytest.mark.needs_gymnax)])
def test_a_run_directory_written_before_item_kinds_resumes_to_the_same_bytes(name, tmp_path, resumed_by_writer):
  """PPO with reward_clip 1 (its checkpoint pickled the actor's clipping adder under its old
  module) and R2D2, embedded and on device: resumed to more steps, they end with the bytes the
  code that wrote them ends with."""
  from jrl.experiment.resume import resumed_configs
  run_dir = str(tmp_path / name)
  shutil.copytree(os.path.join(OLD_RUNS, name), run_dir)
  steps, learner_steps = OLD_RUN_EXTENDED[name]
  exp, cfg = resumed_configs(run_dir, {"steps": steps, "progress_seconds": 0.0}, {})
  if exp.backend == "device":
    from jrl.run.device.runner import run_device as run
  else:
    from jrl.run.embedded import run
  summary = run(exp, cfg)
  assert summary["resumed"] and (summary["actor_steps"], summary["learner_steps"]) == (steps, learner_steps)
  if jax.__version__ == OLD_RUNS_JAX:  # another JAX computes other last bits
    assert summary["params_digest"] == resumed_by_writer(WRITER, os.path.join(OLD_RUNS, name), steps)["params_digest"]
