"""Env factory, spec and the actor on real gymnasium envs, episode boundaries included."""

import subprocess
import sys

import gymnasium as gym
import jax
import numpy as np
import pytest

from jrl import envs
from jrl.actors.actor import Actor, LocalPolicy
from jrl.actors.variables import VariableClient
from jrl.agents import dqn
from jrl.errors import ConfigError
from jrl.replay.adders import NStepTransitionAdder
from jrl.specs import make_env_spec


class _Source:
  def __init__(self, params):
    self.params, self.version = params, 0

  def get_variables(self):
    self.version += 1
    return self.params, self.version


def test_specs_from_spaces():
  spec = make_env_spec(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2))
  assert spec.discrete and spec.num_actions == 2 and spec.observation_shape == (4,)
  box = make_env_spec(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-2, 2, (1,)))
  assert not box.discrete and box.action_shape == (1,) and float(box.action_high[0]) == 2.0
  with pytest.raises(ConfigError, match="^env: observation space"):
    make_env_spec(gym.spaces.Discrete(3), gym.spaces.Discrete(2))
  with pytest.raises(ConfigError, match="^env: unknown gymnasium id 'CartPol-v1'"):
    envs.check_env_id("CartPol-v1")


def test_vector_env_seeding_repeats():
  a, b = envs.make_vector_env("CartPole-v1", 3, seed=7), envs.make_vector_env("CartPole-v1", 3, seed=7)
  oa, _ = a.reset(seed=7)
  ob, _ = b.reset(seed=7)
  np.testing.assert_array_equal(oa, ob)
  assert not np.array_equal(oa[0], oa[1])  # env i is seeded with seed + i


def test_actor_transitions_respect_episode_boundaries_on_cartpole():
  cfg = dqn.Config(hidden_sizes=(8,), n_step=1, epsilon_init=1.0, epsilon_final=1.0)
  env = envs.make_vector_env("CartPole-v1", 4, seed=0)
  networks = dqn.make_networks(envs.env_spec(env), cfg)
  collected = []
  policy = LocalPolicy(dqn.make_policy(networks, cfg), VariableClient(_Source(networks.init(jax.random.PRNGKey(0))), 5),
                       jax.random.PRNGKey(1))
  actor = Actor(env, policy, adder=NStepTransitionAdder(4, 1, 0.99), sink=collected.append)
  episodes = []
  for _ in range(200):
    episodes += actor.step().returns
  assert actor.env_steps == 800 and len(episodes) >= 10  # random play ends episodes every ~20 steps
  t = [np.concatenate(x) for x in zip(*collected)]
  obs, action, reward, discount, next_obs = t
  assert len(reward) == 800  # one 1-step transition per env step
  terminal = discount == 0.0
  assert terminal.sum() == len(episodes)  # random CartPole episodes end by termination only
  # A terminal transition bootstraps from the true final state, which is out of bounds.
  out_of_bounds = (np.abs(next_obs[:, 0]) > 2.4) | (np.abs(next_obs[:, 2]) > 0.2095)
  np.testing.assert_array_equal(out_of_bounds, terminal)
  np.testing.assert_allclose(discount[~terminal], 0.99)
  # Consecutive non-terminal transitions chain: the next observation is a fresh, in-bounds state.
  assert np.all(np.abs(obs[:, 2]) <= 0.2095)
  assert sum(episodes) <= reward.sum() == 800  # finished episodes are part of what was written


def test_core_imports_neither_reverb_nor_launchpad():
  code = ("import sys, jrl.agents.dqn, jrl.actors.actor, jrl.learners.learner, jrl.replay.batches, "
          "jrl.replay.buffer, jrl.run.embedded; "
          "print(any(m in sys.modules for m in ('reverb', 'launchpad')))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert out.stdout.strip() == "False", out.stderr


def test_variable_client_keeps_params_on_device_and_copies_only_new_versions():
  class NumpySource:  # as a source over RPC: numpy params, a version that moves on learner calls
    def __init__(self):
      self.params, self.version = {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, 3

    def get_variables(self):
      return jax.tree_util.tree_map(np.copy, self.params), self.version

  source = NumpySource()
  client = VariableClient(source, update_period=2)
  first = client.params["w"]
  assert isinstance(first, jax.Array) and first.devices() == {jax.local_devices()[0]}
  np.testing.assert_array_equal(np.asarray(first), source.params["w"])
  for _ in range(6):  # same version: the device copy stays, no new one is made
    client.maybe_update()
  assert client.params["w"] is first and client.copies == 1 and client.version == 3
  source.params, source.version = {"w": source.params["w"] + 1}, 4
  client.maybe_update()  # the period's first call: not yet due
  assert client.params["w"] is first
  client.maybe_update()
  assert client.version == 4 and client.copies == 2
  np.testing.assert_array_equal(np.asarray(client.params["w"]), np.arange(6).reshape(2, 3) + 1)
  on_device = {"w": jax.device_put(np.ones(3, np.float32))}  # embedded learner: already on the device, not copied
  local = VariableClient(type("S", (), {"get_variables": lambda self: (on_device, 0)})())
  assert local.params["w"].unsafe_buffer_pointer() == on_device["w"].unsafe_buffer_pointer()


def _acting(dispatch_ahead: bool, steps: int, resume_at=None):
  """Transitions and episode returns of a DQN actor on CartPole (exploring: epsilon 0.5)."""
  cfg = dqn.Config(hidden_sizes=(8,), n_step=2, epsilon_init=0.5, epsilon_final=0.5)
  env = envs.make_vector_env("CartPole-v1", 4, seed=3)
  networks = dqn.make_networks(envs.env_spec(env), cfg)
  params = networks.init(jax.random.PRNGKey(0))

  def make_actor(env):
    policy = LocalPolicy(dqn.make_policy(networks, cfg), VariableClient(_Source(params)), jax.random.PRNGKey(1))
    return Actor(env, policy, adder=NStepTransitionAdder(4, 2, 0.99), sink=collected.append,
                 dispatch_ahead=dispatch_ahead)

  collected, returns = [], []
  actor = make_actor(env)
  for t in range(steps):
    if t == resume_at:  # continue in a fresh actor from the saved state
      state = actor.state()
      actor = make_actor(envs.make_vector_env("CartPole-v1", 4, seed=99))
      assert actor.restore(state, reset_seed=0)
    returns += actor.step().returns
  return [np.concatenate(x) for x in zip(*collected)], returns


def test_dispatching_the_policy_ahead_changes_nothing_with_fixed_parameters():
  """The next actions are asked for before this step's inserts: with parameters that do not
  change, the same transitions (to the byte) and episodes as asking after them; also across
  a saved and restored actor whose actions were already asked for."""
  plain, plain_returns = _acting(False, 150)
  ahead, ahead_returns = _acting(True, 150)
  resumed, resumed_returns = _acting(True, 150, resume_at=77)
  assert len(plain_returns) >= 10 and len(plain[2]) >= 500
  for other, other_returns in ((ahead, ahead_returns), (resumed, resumed_returns)):
    assert other_returns == plain_returns
    for x, y in zip(plain, other):
      assert x.dtype == y.dtype and x.tobytes() == y.tobytes()
