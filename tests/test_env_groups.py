"""Env groups (`--env_groups`): the actor's envs step as groups in turn, sharing one policy state."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from jrl import envs
from jrl.actors.actor import Actor, GroupedActor, GroupedPolicy, LocalPolicy, per_env_leaves
from jrl.actors.variables import VariableClient
from jrl.agents import dqn, r2d2
from jrl.errors import ConfigError
from jrl.experiment.config import ExperimentConfig
from jrl.run.embedded import run
from jrl.replay.adders import NStepTransitionAdder

NUM_ENVS, GROUPS = 4, 2
SIZE = NUM_ENVS // GROUPS


class _Source:
  def __init__(self, params):
    self.params = params

  def get_variables(self):
    return self.params, 0


def _grouped_envs(seed=0):
  return [envs.make_vector_env("CartPole-v1", SIZE, seed + g * SIZE) for g in range(GROUPS)]


def _r2d2_policies(evaluation):
  env = envs.make_vector_env("CartPole-v1", 1, 0)
  cfg = r2d2.Config(hidden_sizes=(16,), lstm_size=8)
  networks = r2d2.make_networks(envs.env_spec(env), cfg)
  policy = r2d2.make_policy(networks, cfg, evaluation=evaluation)
  return policy, VariableClient(_Source(networks.init(jax.random.PRNGKey(0))))


def test_per_env_leaves_are_the_recurrent_core_not_the_key_or_the_step_count():
  policy, _ = _r2d2_policies(evaluation=False)
  mask = per_env_leaves(policy.init, jax.random.PRNGKey(0), NUM_ENVS)
  assert (mask.key, mask.env_steps, mask.core) == (False, False, True)
  cfg = dqn.Config(hidden_sizes=(8,))
  feedforward = dqn.make_policy(dqn.make_networks(envs.env_spec(envs.make_vector_env("CartPole-v1", 1, 0)), cfg), cfg)
  assert not any(jax.tree_util.tree_leaves(per_env_leaves(feedforward.init, jax.random.PRNGKey(0), NUM_ENVS)))


def test_groups_of_a_greedy_recurrent_policy_play_as_one_actor_does():
  """Greedy actions depend only on each env's own history: the groups must carry every env's
  core state exactly as one policy call over all envs does."""
  policy, variables = _r2d2_policies(evaluation=True)
  one = Actor(envs.make_vector_env("CartPole-v1", NUM_ENVS, 0), LocalPolicy(policy, variables, jax.random.PRNGKey(1)))
  grouped_policy = GroupedPolicy(policy, variables, jax.random.PRNGKey(1), NUM_ENVS, GROUPS)
  grouped = GroupedActor(_grouped_envs(), grouped_policy, [None] * GROUPS)
  one_returns, grouped_returns = [], []
  for _ in range(150):
    one_returns += one.step().returns
    grouped_returns += grouped.step().returns
    np.testing.assert_array_equal(np.concatenate([g._obs for g in grouped.groups]), one._obs)
  assert len(one_returns) >= 4 and sorted(grouped_returns) == sorted(one_returns)
  np.testing.assert_allclose(grouped_policy.state().core, one.policy.state().core, rtol=1e-5, atol=1e-6)
  assert int(grouped_policy.state().env_steps) == int(one.policy.state().env_steps) == 150 * NUM_ENVS


@pytest.mark.parametrize("dispatch_ahead", [False, True])
def test_grouped_actor_continues_exactly_after_restore(dispatch_ahead):
  cfg = dqn.Config(hidden_sizes=(8,), epsilon_decay_steps=400)
  networks = dqn.make_networks(envs.env_spec(envs.make_vector_env("CartPole-v1", 1, 0)), cfg)
  variables = VariableClient(_Source(networks.init(jax.random.PRNGKey(0))))

  def make(sink):
    policy = GroupedPolicy(dqn.make_policy(networks, cfg), variables, jax.random.PRNGKey(3), NUM_ENVS, GROUPS)
    return GroupedActor(_grouped_envs(), policy, [NStepTransitionAdder(SIZE, 3, 0.99) for _ in range(GROUPS)],
                        sink=sink, dispatch_ahead=dispatch_ahead)

  first, second = [], []
  a = make(first.append)
  for _ in range(60):
    a.step()
  b = make(second.append)
  assert b.restore(a.state(), reset_seed=99)
  del first[:]
  for _ in range(40):
    a.step()
    b.step()
  assert a.env_steps == b.env_steps == 100 * NUM_ENVS
  assert len(first) == len(second) == 80
  for x, y in zip(first, second):
    assert all(u.tobytes() == v.tobytes() for u, v in zip(x, y))
  # The exploration schedule counts the whole actor's env steps, not one group's (and, with
  # dispatch_ahead, the steps every group has already asked actions for).
  assert int(a.policy.state().env_steps) == 100 * NUM_ENVS + (NUM_ENVS if dispatch_ahead else 0)


def test_env_groups_config_errors_name_the_field():
  with pytest.raises(ConfigError, match="^env_groups: must be >= 1 and divide num_envs=8, got 3"):
    ExperimentConfig(env_groups=3)
  with pytest.raises(ConfigError, match="^env_groups: groups take turns"):
    ExperimentConfig(env_groups=2, inference="server", distributed=True)
  with pytest.raises(ConfigError, match="^env_groups: applies to the host backend"):
    ExperimentConfig(env_groups=2, backend="device")


def test_embedded_run_with_env_groups_repeats_its_bytes(tmp_path):
  short = dict(steps=2_000, eval_every=1_000, eval_episodes=2, log_every=500, progress_seconds=0,
               deterministic=True, num_envs=4, env_groups=2)
  agent = dqn.Config(min_replay_size=300, hidden_sizes=(16,))
  a = run(ExperimentConfig(seed=0, run_dir=str(tmp_path / "a"), **short), agent)
  b = run(ExperimentConfig(seed=0, run_dir=str(tmp_path / "b"), **short), agent)
  assert a["actor_steps"] >= 2_000 and a["learner_steps"] > 0
  assert a["params_digest"] == b["params_digest"]


@pytest.mark.slow
@pytest.mark.needs_reverb
def test_actor_nodes_step_env_groups(tmp_path):
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  run_dir = tmp_path / "dist"
  out = subprocess.run([sys.executable, "-m", "launch.train", "--distributed", "--num_actors", "1", "--steps", "2000",
                        "--num_envs", "4", "--env_groups", "2", "--min_replay_size", "500", "--eval_every", "1000",
                        "--eval_episodes", "2", "--hidden_sizes", "16", "--run_dir", str(run_dir)],
                       cwd=root, text=True, capture_output=True, timeout=420)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  summary = json.load(open(run_dir / "summary.json"))
  assert summary["actor_steps"] >= 2000 and summary["learner_steps"] > 0
  assert json.load(open(run_dir / "config.json"))["experiment"]["env_groups"] == 2
