"""DQN's pure pieces against a numpy reference and their transform properties."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jrl.agents import dqn, exploration, get_agent
from jrl.agents.dqn.learning import td_errors
from jrl.agents.dqn.networks import Networks
from jrl.errors import ConfigError
from jrl.specs import EnvSpec
from jrl.types import LearnerBatch, Transition

SPEC = EnvSpec(observation_shape=(4,), observation_dtype=np.dtype(np.float32), action_shape=(),
               action_dtype=np.dtype(np.int32), num_actions=3)


def _batch(rng, batch_size=16):
  obs = rng.normal(size=(batch_size, 4)).astype(np.float32)
  next_obs = rng.normal(size=(batch_size, 4)).astype(np.float32)
  action = rng.integers(0, 3, size=batch_size).astype(np.int32)
  reward = rng.normal(size=batch_size).astype(np.float32)
  discount = np.where(rng.random(batch_size) < 0.3, 0.0, 0.99 ** 3).astype(np.float32)
  weights = rng.uniform(0.2, 1.0, size=batch_size).astype(np.float32)
  return LearnerBatch(Transition(obs, action, reward, discount, next_obs), weights)


def _huber(x, delta):
  a = np.abs(x)
  return np.where(a <= delta, 0.5 * x ** 2, delta * (a - 0.5 * delta))


@pytest.mark.parametrize("double_q", [True, False])
def test_td_errors_and_loss_match_numpy_reference(double_q):
  rng = np.random.default_rng(0)
  batch = _batch(rng)
  w_online = rng.normal(size=(4, 3)).astype(np.float32)
  w_target = rng.normal(size=(4, 3)).astype(np.float32)
  linear = Networks(init=None, apply=lambda params, obs: obs @ params)

  td = np.asarray(td_errors(linear, jnp.asarray(w_online), jnp.asarray(w_target), batch, double_q))

  t = batch.transitions
  q_tm1 = t.observation @ w_online
  q_next_target = t.next_observation @ w_target
  if double_q:
    best_next = np.argmax(t.next_observation @ w_online, axis=1)        # selected by the online net
    q_next = q_next_target[np.arange(16), best_next]                     # valued by the target net
  else:
    q_next = q_next_target.max(axis=1)                                   # the target net's max
  target = t.reward + t.discount * q_next
  expected = target - q_tm1[np.arange(16), t.action]
  np.testing.assert_allclose(td, expected, rtol=1e-5, atol=1e-5)
  # The two targets differ on this batch, so each branch is checked against its own reference.
  other = np.asarray(td_errors(linear, jnp.asarray(w_online), jnp.asarray(w_target), batch, not double_q))
  assert np.abs(other - expected).max() > 1e-2

  cfg = dqn.Config(huber_delta=0.5, double_q=double_q)
  learner = dqn.make_learner(linear._replace(init=lambda key: jnp.asarray(w_online)), cfg)
  state = learner.init(jax.random.PRNGKey(0))
  state = state._replace(target_params=jnp.asarray(w_target))
  _, metrics = learner.update(state, batch)
  expected_loss = np.mean(batch.weights * _huber(expected, 0.5))
  np.testing.assert_allclose(float(metrics["loss"]), expected_loss, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(metrics["priorities"]), np.abs(expected), rtol=1e-5, atol=1e-5)


def test_terminated_transitions_do_not_bootstrap():
  rng = np.random.default_rng(1)
  batch = _batch(rng)
  batch = batch._replace(transitions=batch.transitions._replace(discount=np.zeros(16, np.float32)))
  linear = Networks(init=None, apply=lambda params, obs: obs @ params)
  w = jnp.asarray(rng.normal(size=(4, 3)).astype(np.float32))
  td = np.asarray(td_errors(linear, w, w * 100.0, batch))
  q_taken = (batch.transitions.observation @ np.asarray(w))[np.arange(16), batch.transitions.action]
  np.testing.assert_allclose(td, batch.transitions.reward - q_taken, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dueling", [False, True])
def test_update_jit_equals_no_jit_and_keeps_structure_and_dtypes(dueling):
  cfg = dqn.Config(hidden_sizes=(32, 32), dueling=dueling, target_update_period=2)
  networks = dqn.make_networks(SPEC, cfg)
  learner = dqn.make_learner(networks, cfg)
  state0 = learner.init(jax.random.PRNGKey(0))
  batch = _batch(np.random.default_rng(2))

  jitted = jax.jit(learner.update)
  state_jit, state_eager = state0, state0
  for _ in range(3):
    state_jit, m_jit = jitted(state_jit, batch)
    state_eager, m_eager = learner.update(state_eager, batch)
  for a, b in zip(jax.tree_util.tree_leaves(state_jit), jax.tree_util.tree_leaves(state_eager)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
  assert jax.tree_util.tree_structure(state_jit) == jax.tree_util.tree_structure(state0)
  assert [x.dtype for x in jax.tree_util.tree_leaves(state_jit)] == [x.dtype for x in jax.tree_util.tree_leaves(state0)]
  assert jitted._cache_size() == 1  # no recompilation after the first call
  assert int(state_jit.steps) == 3


def test_loss_falls_on_a_fixed_batch_and_target_copies_periodically():
  cfg = dqn.Config(hidden_sizes=(32,), target_update_period=5, learning_rate=1e-2)
  networks = dqn.make_networks(SPEC, cfg)
  learner = dqn.make_learner(networks, cfg)
  update = jax.jit(learner.update)
  state = learner.init(jax.random.PRNGKey(0))
  batch = _batch(np.random.default_rng(3), 64)
  losses = []
  for step in range(1, 11):
    state, metrics = update(state, batch)
    losses.append(float(metrics["loss"]))
    same = all(np.array_equal(a, b) for a, b in zip(jax.tree_util.tree_leaves(state.params),
                                                    jax.tree_util.tree_leaves(state.target_params)))
    assert same == (step % 5 == 0), step
  assert losses[-1] < losses[0]


def test_polyak_target_update():
  cfg = dqn.Config(hidden_sizes=(8,), target_update_tau=0.25)
  networks = dqn.make_networks(SPEC, cfg)
  learner = dqn.make_learner(networks, cfg)
  state = learner.init(jax.random.PRNGKey(0))
  new_state, _ = learner.update(state, _batch(np.random.default_rng(4)))
  for p, t_old, t_new in zip(*(jax.tree_util.tree_leaves(x) for x in
                               (new_state.params, state.target_params, new_state.target_params))):
    np.testing.assert_allclose(t_new, 0.25 * p + 0.75 * t_old, rtol=1e-5, atol=1e-7)


def test_policies_greedy_and_epsilon_schedule():
  cfg = dqn.Config(hidden_sizes=(16,), epsilon_init=1.0, epsilon_final=0.1, epsilon_decay_steps=100)
  networks = dqn.make_networks(SPEC, cfg)
  params = networks.init(jax.random.PRNGKey(0))
  obs = np.random.default_rng(5).normal(size=(256, 4)).astype(np.float32)
  greedy = networks.apply(params, obs).argmax(-1)

  evaluation = dqn.make_policy(networks, cfg, evaluation=True)
  first = np.ones(len(obs), bool)
  eval_state = evaluation.init(jax.random.PRNGKey(1), len(obs))
  action, _, _ = jax.jit(evaluation.select_action)(params, obs, first, eval_state)
  np.testing.assert_array_equal(action, greedy)

  schedule = exploration.epsilon_schedule(cfg)
  assert float(schedule(0)) == pytest.approx(1.0)
  assert float(schedule(50)) == pytest.approx(0.55)
  assert float(schedule(1000)) == pytest.approx(0.1)

  acting = dqn.make_policy(networks, cfg)
  state = acting.init(jax.random.PRNGKey(2), len(obs))
  state = state._replace(env_steps=jnp.asarray(10_000, jnp.int32))  # epsilon = 0.1
  action, _, new_state = jax.jit(acting.select_action)(params, obs, first, state)
  differs = float(np.mean(np.asarray(action) != np.asarray(greedy)))
  assert 0.02 < differs < 0.15  # expected 0.1 * 2/3
  assert int(new_state.env_steps) == 10_256


def test_config_validation_names_the_field():
  with pytest.raises(ConfigError, match="^batch_size: must be > 0"):
    dqn.Config(batch_size=0)
  with pytest.raises(ConfigError, match="^discount: must be in"):
    dqn.Config(discount=1.5)
  with pytest.raises(ConfigError, match="^min_replay_size"):
    dqn.Config(min_replay_size=4, block_size=8)
  with pytest.raises(ConfigError, match="^agent: unknown agent 'nope'"):
    get_agent("nope")


def test_continuous_actions_are_refused():
  box_spec = dataclasses.replace(SPEC, num_actions=None, action_shape=(1,), action_dtype=np.dtype(np.float32))
  with pytest.raises(ConfigError, match="^agent: dqn needs a Discrete action space"):
    dqn.make_networks(box_spec, dqn.Config())
