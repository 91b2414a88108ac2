"""TD3: its target against a numpy reference (n-step sums from the real adder, clipped smoothing
noise, the min of the twins), the delayed actor and target updates, the policy's noise and
bounds, bad input, and learning Pendulum (embedded and on device: the slow tier)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jrl.agents import td3
from jrl.errors import ConfigError
from jrl.replay.adders import NStepTransitionAdder
from jrl.specs import EnvSpec
from jrl.types import LearnerBatch, Transition

SPEC = EnvSpec((3,), np.dtype(np.float32), (2,), np.dtype(np.float32),
               action_low=np.array([-2.0, 0.0], np.float32), action_high=np.array([2.0, 1.0], np.float32))


def _mlp(layers, x, final=None):
  """numpy forward of flax Dense layers [{kernel, bias}], ReLU between them (and after the last
  hidden one, as jrl.networks.MLP), `final` applied to the output layer."""
  *hidden, out = layers
  for layer in hidden:
    x = np.maximum(x @ np.asarray(layer["kernel"], np.float64) + np.asarray(layer["bias"], np.float64), 0.0)
  x = x @ np.asarray(out["kernel"], np.float64) + np.asarray(out["bias"], np.float64)
  return final(x) if final else x


def _policy_np(params, obs):
  p = params["params"]
  mlp = [p["MLP_0"][f"Dense_{i}"] for i in range(len(p["MLP_0"]))]
  return _mlp(mlp + [p["Dense_0"]], obs, np.tanh)


def _twin_q_np(params, obs, action):
  p, x = params["params"], np.concatenate([obs, action], axis=-1)
  return np.stack([_mlp([p[f"MLP_{i}"][f"Dense_{j}"] for j in range(len(p[f"MLP_{i}"]))] + [p[f"Dense_{i}"]],
                        x)[:, 0] for i in range(2)])


def test_critic_targets_match_a_numpy_reference_with_n_step_sums():
  cfg = td3.Config(hidden_sizes=(8, 8), n_step=3, discount=0.9, target_noise=0.6, target_noise_clip=0.5)
  networks = td3.make_networks(SPEC, cfg)
  state = td3.make_learner(networks, cfg).init(jax.random.PRNGKey(0))
  # Targets differ from the online nets, as after training: fresh parameters for both.
  state = state._replace(target_policy_params=networks.policy_init(jax.random.PRNGKey(7)),
                         target_q_params=networks.q_init(jax.random.PRNGKey(8)))
  # One env: 6 steps, the episode terminating at step 4 (index 3), a new one after it.
  rng = np.random.default_rng(0)
  obs = rng.normal(size=(7, 3)).astype(np.float32)
  actions = rng.uniform([-2, 0], [2, 1], size=(6, 2)).astype(np.float32)
  rewards = np.array([1.0, -0.5, 2.0, 0.25, 3.0, -1.0], np.float32)
  terminated = np.array([0, 0, 0, 1, 0, 0], bool)
  final_obs = rng.normal(size=3).astype(np.float32)  # the terminal observation of the first episode
  adder = NStepTransitionAdder(1, cfg.n_step, cfg.discount)
  rows = []
  for t in range(6):
    next_obs = final_obs if terminated[t] else obs[t + 1]
    out = adder.add(obs[t][None], actions[t][None], rewards[t:t + 1], terminated[t:t + 1], np.zeros(1, bool),
                    next_obs[None])
    rows += [Transition(*[np.asarray(x)[i] for x in out]) for i in range(len(out.reward))]
  batch = Transition(*[np.stack(x) for x in zip(*rows)])
  # Hand-made expectation for each transition: the start index t, where the n-step window ends.
  starts = [0, 1, 2, 3]  # windows from steps 0..3 are complete (0-2 end at or before the termination)
  assert len(rows) == len(starts)
  noise = rng.normal(size=(len(starts), 2)).astype(np.float32)
  expected = []
  for i, t in enumerate(starts):
    end = min(t + cfg.n_step, 4)  # the episode ends after step index 3
    ret = sum(cfg.discount ** k * rewards[t + k] for k in range(end - t))
    done = end == 4
    bootstrap_obs = (final_obs if done else obs[end])[None].astype(np.float64)
    smoothing = np.clip(cfg.target_noise * noise[i], -cfg.target_noise_clip, cfg.target_noise_clip)
    next_action = np.clip(_policy_np(state.target_policy_params, bootstrap_obs) + smoothing, -1.0, 1.0)
    next_q = _twin_q_np(state.target_q_params, bootstrap_obs, next_action).min(axis=0)[0]
    expected.append(ret + (0.0 if done else cfg.discount ** cfg.n_step) * next_q)
  np.testing.assert_allclose(batch.observation, obs[starts])
  got = td3.critic_targets(networks, state, batch, jnp.asarray(noise), cfg)
  np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-5)
  # The smoothing noise is clipped: noise of 10 standard deviations moves the action by at most c.
  big = td3.smoothed_target_action(networks, state.target_policy_params, batch.next_observation,
                                   jnp.full((len(starts), 2), 10.0), cfg)
  plain = networks.policy_apply(state.target_policy_params, batch.next_observation)
  np.testing.assert_allclose(np.asarray(big), np.minimum(np.asarray(plain) + cfg.target_noise_clip, 1.0), atol=1e-6)


def _random_batch(size=32, seed=0, discount=0.99):
  rng = np.random.default_rng(seed)
  return LearnerBatch(Transition(rng.normal(size=(size, 3)).astype(np.float32),
                                 rng.uniform([-2, 0], [2, 1], size=(size, 2)).astype(np.float32),
                                 rng.normal(size=size).astype(np.float32), np.full(size, discount, np.float32),
                                 rng.normal(size=(size, 3)).astype(np.float32)), np.ones(size, np.float32))


def test_actor_and_targets_move_only_every_policy_delay_updates():
  cfg = td3.Config(hidden_sizes=(16, 16), policy_delay=3, tau=0.5)
  networks = td3.make_networks(SPEC, cfg)
  learner = td3.make_learner(networks, cfg)
  update = jax.jit(learner.update)
  state, batch = learner.init(jax.random.PRNGKey(0)), _random_batch()
  same = lambda a, b: all(np.array_equal(x, y) for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))
  moved = []
  for step in range(1, 7):
    new, metrics = update(state, batch)
    assert not same(new.q_params, state.q_params)  # the critics learn every update
    actor_moved = not same(new.policy_params, state.policy_params)
    assert actor_moved == (not same(new.target_policy_params, state.target_policy_params))
    assert actor_moved == (not same(new.target_q_params, state.target_q_params))
    assert (float(metrics["actor_loss"]) != 0.0) == actor_moved
    if actor_moved:  # counted policy_delay times, so that its mean over updates is the actor's loss
      loss = td3.actor_loss(networks, state.policy_params, new.q_params, batch.transitions.observation, cfg)
      np.testing.assert_allclose(float(metrics["actor_loss"]), 3 * float(loss), rtol=1e-6)
    moved.append(actor_moved)
    state = new
  assert moved == [False, False, True, False, False, True]
  assert int(state.steps) == 6 and update._cache_size() == 1


def test_critic_loss_falls_and_the_actor_climbs_the_critic():
  cfg = td3.Config(hidden_sizes=(32, 32), policy_delay=1)
  networks = td3.make_networks(SPEC, cfg)
  learner = td3.make_learner(networks, cfg)
  update = jax.jit(learner.update)
  # discount 0: the targets are the rewards, so the critics' loss is a regression that must fall.
  state, batch = learner.init(jax.random.PRNGKey(1)), _random_batch(64, seed=1, discount=0.0)
  obs = batch.transitions.observation
  q_of_policy = lambda s: float(networks.q_apply(s.q_params, obs, networks.policy_apply(s.policy_params, obs))[0].mean())
  losses = []
  for _ in range(100):
    state, metrics = update(state, batch)
    losses.append(float(metrics["critic_loss"]))
  assert losses[-1] < 0.5 * losses[0]
  # With the critics held fixed, actor steps raise Q_1 of the policy's actions.
  before = q_of_policy(state)
  actor_only = td3.make_learner(networks, td3.Config(hidden_sizes=(32, 32), policy_delay=1, critic_learning_rate=1e-12))
  for _ in range(20):
    state, _ = jax.jit(actor_only.update)(state, batch)
  assert q_of_policy(state) > before


def test_policy_explores_within_bounds_and_evaluates_deterministically():
  cfg = td3.Config(hidden_sizes=(8,), uniform_steps=64, exploration_noise=0.3)
  networks = td3.make_networks(SPEC, cfg)
  params = networks.policy_init(jax.random.PRNGKey(0))
  obs = np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32)
  first = np.ones(64, bool)
  policy = td3.make_policy(networks, cfg)
  state = policy.init(jax.random.PRNGKey(1), 64)
  uniform, _, state = policy.select_action(params, obs, first, state)   # env_steps 0 < 64: uniform in the bounds
  noisy, _, state = policy.select_action(params, obs, first, state)     # env_steps 64: policy + noise
  greedy = td3.make_policy(networks, cfg, evaluation=True)
  mode, extras, _ = greedy.select_action(params, obs, first, greedy.init(jax.random.PRNGKey(2), 64))
  low, high = SPEC.action_low, SPEC.action_high
  for action in (uniform, noisy, mode):
    assert action.shape == (64, 2) and np.all(action >= low) and np.all(action <= high)
  np.testing.assert_allclose(mode, networks.to_env(networks.policy_apply(params, obs)), atol=1e-6)
  assert extras == {}
  # Uniform actions spread over the box; noisy ones stay near the policy's (noise std 0.3 of half the range).
  assert np.std(networks.from_env(uniform)) > 0.5
  residual = np.asarray(networks.from_env(noisy)) - np.asarray(networks.policy_apply(params, obs))
  assert 0.15 < np.std(residual) < 0.4


def test_discrete_actions_and_bad_fields_are_refused():
  with pytest.raises(ConfigError, match="agent: td3 needs a Box action space"):
    td3.make_networks(EnvSpec((4,), np.dtype(np.float32), (), np.dtype(np.int32), num_actions=2), td3.Config())
  for field, value in (("policy_delay", 0), ("target_noise", -0.1), ("tau", 2.0), ("n_step", 0)):
    with pytest.raises(ConfigError) as raised:
      td3.Config(**{field: value})
    assert raised.value.field == field


@pytest.mark.long  # a learning run; its wiring: this file's fast tests and the embedded runs of tests/test_runs.py
@pytest.mark.slow
def test_td3_reaches_minus_200_on_pendulum_within_30k_steps(tmp_path):
  from jrl.experiment.config import ExperimentConfig
  from jrl.run.embedded import run
  exp = ExperimentConfig(agent="td3", env="Pendulum-v1", seed=0, steps=30_000, deterministic=True,
                         stop_at_threshold=True, eval_every=2_000, reward_threshold=-200.0,
                         run_dir=str(tmp_path / "td3"), progress_seconds=0)
  summary = run(exp, td3.Config())
  assert summary["steps_to_threshold"] is not None and summary["best_eval_return"] >= -200.0, summary


@pytest.mark.long  # a learning run; its wiring: the device loop's tests (tests/test_device.py)
@pytest.mark.slow
@pytest.mark.needs_gymnax
def test_td3_reaches_minus_200_on_gymnax_pendulum_on_device(tmp_path):
  from jrl.run.device.runner import run_device
  from jrl.experiment.config import ExperimentConfig
  exp = ExperimentConfig(agent="td3", env="gymnax:Pendulum-v1", backend="device", seed=0, steps=30_000,
                         stop_at_threshold=True, eval_every=2_000, reward_threshold=-200.0,
                         run_dir=str(tmp_path / "td3"), progress_seconds=0)
  summary = run_device(exp, td3.Config())
  assert summary["steps_to_threshold"] is not None and summary["best_eval_return"] >= -200.0, summary
  assert summary["details"]["loop_compiles"] == 0
