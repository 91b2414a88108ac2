"""PPO: GAE across episode boundaries by hand and against rlax, the clipped objective and value
clipping by hand, the evaluation policy's mode or samples, the sequence adder, and transform
properties of the update."""

import dataclasses

import jax
import numpy as np
import pytest
import rlax

from jrl.agents import impala, ppo
from jrl.agents.ppo.learning import Minibatch, clipped_policy_loss, gae_advantages, value_errors
from jrl.replay.adders import SequenceAdder
from jrl.specs import EnvSpec
from jrl.types import LearnerBatch, Trajectory

SPEC = EnvSpec((4,), np.dtype(np.float32), (), np.dtype(np.int32), num_actions=2)


def test_gae_without_boundaries_equals_rlax():
  rng = np.random.default_rng(0)
  reward, values = rng.normal(size=6).astype(np.float32), rng.normal(size=7).astype(np.float32)
  ours = gae_advantages(reward, np.ones(6, np.float32), np.zeros(6, np.float32), values[:-1], values[1:], 0.9, 0.8)
  reference = rlax.truncated_generalized_advantage_estimation(reward, np.full(6, 0.9, np.float32), 0.8, values)
  np.testing.assert_allclose(ours, reference, rtol=1e-6)


@pytest.mark.parametrize("terminated, expected", [
    # Step 1 truncated: bootstrap from its final observation (value 0.8), cut the trace.
    (False, [1.04 + 0.45 * 2.12, 2 + 0.9 * 0.8 - 0.6, 3 + 0.9 * 0.2 - 0.1]),
    # Step 1 terminated: no bootstrap, cut the trace.
    (True, [1.04 + 0.45 * 1.4, 2 - 0.6, 3 + 0.9 * 0.2 - 0.1]),
])
def test_gae_by_hand_across_an_episode_boundary(terminated, expected):
  # Values: step 0 (0.5) -> step 1 (0.6) ends an episode with final obs value 0.8;
  # step 2 starts the next episode (0.1) and bootstraps from 0.2. gamma 0.9, lambda 0.5.
  reward = np.array([1.0, 2.0, 3.0], np.float32)
  discount = np.array([1.0, 0.0 if terminated else 1.0, 1.0], np.float32)
  end = np.array([0.0, 1.0, 0.0], np.float32)
  value = np.array([0.5, 0.6, 0.1], np.float32)
  next_value = np.array([0.6, 0.8, 0.2], np.float32)
  advantages = jax.jit(gae_advantages, static_argnums=(5, 6))(reward, discount, end, value, next_value, 0.9, 0.5)
  np.testing.assert_allclose(advantages, expected, rtol=1e-5)


def test_clipped_objective_by_hand():
  behaviour = np.log(np.array([0.5, 0.5, 0.5, 0.5], np.float32))
  current = np.log(np.array([0.75, 0.55, 0.3, 0.45], np.float32))  # ratios 1.5, 1.1, 0.6, 0.9
  advantages = np.array([2.0, -1.0, -3.0, 1.0], np.float32)
  # min(r A, clip(r, 0.8, 1.2) A): 1.2*2=2.4, min(-1.1, -1.1)=-1.1, min(-1.8, -2.4)=-2.4, 0.9
  expected = -np.mean([2.4, -1.1, -2.4, 0.9])
  assert float(clipped_policy_loss(current, behaviour, advantages, 0.2)) == pytest.approx(expected, rel=1e-5)


def test_value_clipping_by_hand():
  # Old values (target - advantage): 1, 1, 1, 1; targets 2, 2, 0, 1.05; clipped to 1 +- 0.2.
  data = Minibatch(None, None, None, np.array([1.0, 1.0, -1.0, 0.05], np.float32),
                   np.array([2.0, 2.0, 0.0, 1.05], np.float32))
  value = np.array([1.5, 0.5, 1.1, 2.0], np.float32)
  # plain errors .25, 2.25, 1.21, .9025; clipped values 1.2, 0.8, 1.1, 1.2: .64, 1.44, 1.21, .0225
  np.testing.assert_allclose(value_errors(value, data, 0.2), [0.64, 2.25, 1.21, 0.9025], rtol=1e-5)
  np.testing.assert_allclose(value_errors(value, data, 0.0), [0.25, 2.25, 1.21, 0.9025], rtol=1e-5)
  traced = jax.jit(lambda eps: value_errors(value, data, eps))  # a sweep's grid may trace it
  np.testing.assert_allclose(traced(0.2), [0.64, 2.25, 1.21, 0.9025], rtol=1e-5)
  np.testing.assert_allclose(traced(0.0), [0.25, 2.25, 1.21, 0.9025], rtol=1e-5)


@pytest.mark.parametrize("agent", [ppo, impala])
def test_evaluation_takes_the_mode_unless_greedy_eval_is_false(agent):
  cfg = agent.Config(hidden_sizes=(8,))
  networks = agent.make_networks(SPEC, cfg)
  params = networks.init(jax.random.PRNGKey(0))
  obs = np.random.default_rng(0).normal(size=(256, 4)).astype(np.float32)
  mode = np.argmax(np.asarray(networks.apply(params, obs)[0]), axis=-1)

  def actions(greedy_eval, seed):
    policy = agent.make_policy(networks, dataclasses.replace(cfg, greedy_eval=greedy_eval), evaluation=True)
    action, _, _ = policy.select_action(params, obs, np.zeros(256, bool), policy.init(jax.random.PRNGKey(seed), 256))
    return np.asarray(action)

  np.testing.assert_array_equal(actions(True, 1), mode)
  np.testing.assert_array_equal(actions(True, 2), mode)
  sampled = actions(False, 1)  # initial logits are near even: samples differ from the mode about half the time
  assert 64 < np.sum(sampled != mode) < 192 and np.any(sampled != actions(False, 2))


def test_sequence_adder_marks_boundaries_and_keeps_extras():
  adder = SequenceAdder(num_envs=2, length=3)
  out = None
  for t in range(3):
    terminated = np.array([t == 1, False])
    truncated = np.array([False, t == 0])
    out = adder.add(np.full((2, 1), t, np.float32), np.array([t, t + 1]), np.array([1.0, 2.0]), terminated,
                    truncated, np.full((2, 1), 10 + t, np.float32), {"log_prob": np.array([-0.1 * t, -0.2])})
    if t < 2:
      assert len(out.reward) == 0
  assert out.observation.shape == (2, 3, 1) and out.extras["log_prob"].shape == (2, 3)
  np.testing.assert_array_equal(out.discount, [[1, 0, 1], [1, 1, 1]])       # termination only
  np.testing.assert_array_equal(out.end_of_episode, [[0, 1, 0], [1, 0, 0]])  # termination or truncation
  np.testing.assert_array_equal(out.action, [[0, 1, 2], [1, 2, 3]])
  np.testing.assert_allclose(out.extras["log_prob"][0], [0.0, -0.1, -0.2])
  np.testing.assert_array_equal(out.next_observation[:, :, 0], [[10, 11, 12], [10, 11, 12]])


def test_update_learns_structure_is_stable_and_jit_matches():
  cfg = ppo.Config(hidden_sizes=(16,), sequence_length=8, batch_size=4, num_minibatches=2, num_epochs=2)
  networks = ppo.make_networks(SPEC, cfg)
  learner = ppo.make_learner(networks, cfg)
  policy = ppo.make_policy(networks, cfg)
  state = learner.init(jax.random.PRNGKey(0))
  rng = np.random.default_rng(0)
  obs = rng.normal(size=(4, 8, 4)).astype(np.float32)
  action, extras, _ = policy.select_action(state.params, obs.reshape(-1, 4), np.zeros(32, bool),
                                           policy.init(jax.random.PRNGKey(1), 32))
  traj = Trajectory(obs, np.asarray(action).reshape(4, 8), (np.asarray(action).reshape(4, 8) == 1).astype(np.float32),
                    np.ones((4, 8), np.float32), np.zeros((4, 8), np.float32),
                    rng.normal(size=(4, 8, 4)).astype(np.float32),
                    {"log_prob": np.asarray(extras["log_prob"]).reshape(4, 8)})
  batch = LearnerBatch(traj, np.ones(4, np.float32))
  jitted = jax.jit(learner.update)
  s_jit, m_jit = jitted(state, batch)
  s_eager, _ = learner.update(state, batch)
  for a, b in zip(jax.tree_util.tree_leaves(s_jit), jax.tree_util.tree_leaves(s_eager)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
  for _ in range(5):
    s_jit, m = jitted(s_jit, batch)
  assert jitted._cache_size() == 1
  assert jax.tree_util.tree_structure(s_jit) == jax.tree_util.tree_structure(state)
  # Action 1 is rewarded: the policy's probability of it rises.
  p_before = jax.nn.softmax(networks.apply(state.params, obs.reshape(-1, 4))[0])[:, 1].mean()
  p_after = jax.nn.softmax(networks.apply(s_jit.params, obs.reshape(-1, 4))[0])[:, 1].mean()
  assert float(p_after) > float(p_before)
