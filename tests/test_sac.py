"""SAC's pure pieces: temperature loss and squashed log-probabilities by hand, rescaling, transforms."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jrl.agents import sac
from jrl.agents.sac.learning import temperature_loss
from jrl.agents.sac.networks import tanh_gaussian
from jrl.errors import ConfigError
from jrl.specs import EnvSpec
from jrl.types import LearnerBatch, Transition

SPEC = EnvSpec((3,), np.dtype(np.float32), (1,), np.dtype(np.float32),
               action_low=np.array([-2.0], np.float32), action_high=np.array([2.0], np.float32))


def test_temperature_loss_by_hand():
  log_prob = jnp.array([-0.5, 0.3, -1.2])
  # -(log alpha) * mean(log_prob + target_entropy) with log alpha = 0.2, target entropy = -1.
  expected = -0.2 * np.mean([-1.5, -0.7, -2.2])
  assert float(temperature_loss(jnp.asarray(0.2), log_prob, -1.0)) == pytest.approx(expected, rel=1e-6)
  # The gradient moves log alpha up when the policy's entropy is below the target (log_prob high).
  grad = jax.grad(temperature_loss)(jnp.asarray(0.0), jnp.array([2.0, 2.0]), -1.0)
  assert float(grad) < 0


def test_tanh_gaussian_log_prob_by_hand():
  mean, log_std = jnp.array([[0.3, -0.2]]), jnp.array([[-0.5, 0.1]])
  u = np.array([[0.4, -1.1]])
  action = np.tanh(u)
  std = np.exp(np.asarray(log_std))
  gaussian = -0.5 * (((u - np.asarray(mean)) / std) ** 2) - np.log(std) - 0.5 * np.log(2 * np.pi)
  expected = (gaussian - np.log(1 - action ** 2)).sum()
  got = float(tanh_gaussian(mean, log_std).log_prob(jnp.asarray(action, jnp.float32))[0])
  assert got == pytest.approx(expected, rel=1e-4)


def test_actions_rescale_to_env_bounds_and_back():
  networks = sac.make_networks(SPEC, sac.Config(hidden_sizes=(8,)))
  np.testing.assert_allclose(networks.to_env(np.array([-1.0, 0.0, 1.0])), [-2.0, 0.0, 2.0])
  np.testing.assert_allclose(networks.from_env(np.array([-2.0, 1.0])), [-1.0, 0.5])
  params = networks.policy_init(jax.random.PRNGKey(0))
  policy = sac.make_policy(networks, sac.Config())
  obs = np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32)
  first = np.ones(len(obs), bool)
  action, _, _ = jax.jit(policy.select_action)(params, obs, first, policy.init(jax.random.PRNGKey(1), len(obs)))
  assert action.shape == (64, 1) and np.all(np.abs(action) <= 2.0)
  greedy = sac.make_policy(networks, sac.Config(), evaluation=True)
  a1, _, _ = greedy.select_action(params, obs, first, greedy.init(jax.random.PRNGKey(1), len(obs)))
  a2, _, _ = greedy.select_action(params, obs, first, greedy.init(jax.random.PRNGKey(2), len(obs)))
  np.testing.assert_array_equal(a1, a2)  # evaluation is deterministic


def test_update_jit_equals_no_jit_and_critic_loss_falls():
  cfg = sac.Config(hidden_sizes=(32, 32))
  networks = sac.make_networks(SPEC, cfg)
  learner = sac.make_learner(networks, cfg)
  rng = np.random.default_rng(0)
  batch = LearnerBatch(Transition(rng.normal(size=(32, 3)).astype(np.float32),
                                  rng.uniform(-2, 2, size=(32, 1)).astype(np.float32),
                                  rng.normal(size=32).astype(np.float32), np.full(32, 0.99, np.float32),
                                  rng.normal(size=(32, 3)).astype(np.float32)), np.ones(32, np.float32))
  state = learner.init(jax.random.PRNGKey(0))
  jitted = jax.jit(learner.update)
  s_jit, m_jit = jitted(state, batch)
  s_eager, m_eager = learner.update(state, batch)
  for a, b in zip(jax.tree_util.tree_leaves(s_jit), jax.tree_util.tree_leaves(s_eager)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
  losses = [float(m_jit["critic_loss"])]
  for _ in range(30):
    s_jit, m_jit = jitted(s_jit, batch)
    losses.append(float(m_jit["critic_loss"]))
  assert losses[-1] < losses[0]
  assert jitted._cache_size() == 1
  assert jax.tree_util.tree_structure(s_jit) == jax.tree_util.tree_structure(state)


def test_discrete_actions_are_refused():
  discrete = EnvSpec((3,), np.dtype(np.float32), (), np.dtype(np.int32), num_actions=2)
  with pytest.raises(ConfigError, match="^agent: sac needs a Box action space"):
    sac.make_networks(discrete, sac.Config())
