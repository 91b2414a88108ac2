"""PQN: Q(lambda) targets across a termination and a truncation against a numpy loop, one learner
update, the epsilon-greedy policy, a continuous env refused in one line, and the defaults reaching
475 on CartPole-v1 within 100k env steps (embedded and on device)."""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest
import rlax

from jrl.agents import pqn
from jrl.errors import ConfigError
from jrl.experiment.config import ExperimentConfig
from jrl.specs import EnvSpec
from jrl.types import LearnerBatch, Trajectory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC = EnvSpec((4,), np.dtype(np.float32), (), np.dtype(np.int32), num_actions=2)


def _numpy_q_lambda(reward, discount, end_of_episode, next_q_max, gamma, lambda_):
  """The recursion written out backwards: G_t = r_t + gamma d_t ((1 - l_t) q_t + l_t G_{t+1}),
  l_t = lambda (1 - end_t), and the last step bootstraps from its own q alone."""
  T = len(reward)
  targets = np.zeros(T, np.float64)
  for t in reversed(range(T)):
    if t == T - 1:
      bootstrap = next_q_max[t]
    else:
      lam = lambda_ * (1.0 - end_of_episode[t])
      bootstrap = (1.0 - lam) * next_q_max[t] + lam * targets[t + 1]
    targets[t] = reward[t] + gamma * discount[t] * bootstrap
  return targets


def test_q_lambda_targets_match_a_numpy_loop_across_termination_and_truncation():
  # Step 1 terminates (discount 0, episode ends); step 3 is truncated (episode ends, discount 1:
  # bootstrap from its final observation's q, trace cut); steps 4-5 belong to the next episode.
  reward = np.array([1.0, 0.5, -1.0, 2.0, 0.25, 3.0], np.float32)
  discount = np.array([1.0, 0.0, 1.0, 1.0, 1.0, 1.0], np.float32)
  end = np.array([0.0, 1.0, 0.0, 1.0, 0.0, 0.0], np.float32)
  next_q_max = np.array([0.7, 9.0, 1.3, 4.0, -0.6, 2.2], np.float32)  # 9.0 at the termination: unused
  gamma, lambda_ = 0.9, 0.8
  ours = jax.jit(pqn.q_lambda_targets, static_argnums=(4, 5))(reward, discount, end, next_q_max, gamma, lambda_)
  expected = _numpy_q_lambda(reward, discount, end, next_q_max, gamma, lambda_)
  np.testing.assert_allclose(ours, expected, atol=1e-6)
  # By hand at the boundaries: the termination takes no bootstrap, the truncation bootstraps fully.
  assert float(ours[1]) == pytest.approx(0.5)
  assert float(ours[3]) == pytest.approx(2.0 + 0.9 * 4.0)
  assert float(ours[5]) == pytest.approx(3.0 + 0.9 * 2.2)
  # Without boundaries it is rlax's lambda-return on the next states' max Q.
  none = np.zeros(6, np.float32)
  ours = pqn.q_lambda_targets(reward, np.ones(6, np.float32), none, next_q_max, gamma, lambda_)
  reference = rlax.lambda_returns(reward, np.full(6, gamma, np.float32), next_q_max, lambda_)
  np.testing.assert_allclose(ours, reference, atol=1e-6)


def _random_batch(rng, b=4, t=8):
  traj = Trajectory(rng.normal(size=(b, t, 4)).astype(np.float32), rng.integers(0, 2, (b, t)).astype(np.int32),
                    rng.normal(size=(b, t)).astype(np.float32), (rng.random((b, t)) > 0.1).astype(np.float32),
                    (rng.random((b, t)) > 0.8).astype(np.float32), rng.normal(size=(b, t, 4)).astype(np.float32), {})
  return LearnerBatch(traj, np.ones(b, np.float32))


def test_one_update_changes_params_with_finite_metrics():
  cfg = pqn.Config(hidden_sizes=(16, 16), sequence_length=8, batch_size=4, num_minibatches=2, num_epochs=2)
  networks = pqn.make_networks(SPEC, cfg)
  learner = pqn.make_learner(networks, cfg)
  state = learner.init(jax.random.PRNGKey(0))
  assert isinstance(state, pqn.TrainingState)
  # Dense -> LayerNorm -> ReLU per hidden layer, then the Q head.
  layers = state.params["params"]["LayerNormMLP_0"]
  assert sorted(layers) == ["Dense_0", "Dense_1", "LayerNorm_0", "LayerNorm_1"]
  assert networks.apply(state.params, np.zeros((3, 4), np.float32)).shape == (3, 2)
  new_state, metrics = jax.jit(learner.update)(state, _random_batch(np.random.default_rng(0)))
  assert sorted(metrics) == ["grad_norm", "loss", "q_mean", "target_mean"]
  assert all(np.shape(v) == () and np.isfinite(v) for v in metrics.values()), metrics
  assert jax.tree_util.tree_structure(new_state) == jax.tree_util.tree_structure(state)
  for old, new in zip(jax.tree_util.tree_leaves(state.params), jax.tree_util.tree_leaves(new_state.params)):
    assert old.shape == new.shape
  assert any(not np.allclose(old, new) for old, new in zip(jax.tree_util.tree_leaves(state.params),
                                                            jax.tree_util.tree_leaves(new_state.params)))
  assert int(new_state.steps) == 1
  # No LayerNorm when asked.
  plain = pqn.make_networks(SPEC, pqn.Config(hidden_sizes=(16,), layer_norm=False)).init(jax.random.PRNGKey(0))
  assert sorted(plain["params"]["LayerNormMLP_0"]) == ["Dense_0"]


def test_default_loss_passed_explicitly_and_a_module_of_ones_own():
  cfg = pqn.Config(hidden_sizes=(16,), sequence_length=8, batch_size=4, num_minibatches=2, num_epochs=1)
  networks = pqn.make_networks(SPEC, cfg)
  batch = _random_batch(np.random.default_rng(1))
  states = []
  for learner in (pqn.make_learner(networks, cfg), pqn.make_learner(networks, cfg, loss=pqn.loss),
                  pqn.make_learner(pqn.make_networks(SPEC, cfg, module=(networks.init, networks.apply)), cfg)):
    states.append(jax.jit(learner.update)(learner.init(jax.random.PRNGKey(0)), batch)[0])
  for other in states[1:]:
    for a, b in zip(jax.tree_util.tree_leaves(states[0].params), jax.tree_util.tree_leaves(other.params)):
      np.testing.assert_array_equal(a, b)


def test_frames_go_through_the_cnn_torso_then_the_layer_norm_mlp():
  spec = EnvSpec((10, 10, 4), np.dtype(np.uint8), (), np.dtype(np.int32), num_actions=3)  # MinAtar-sized
  networks = pqn.make_networks(spec, pqn.Config(hidden_sizes=(32,)))
  params = networks.init(jax.random.PRNGKey(0))
  assert sorted(params["params"]) == ["Dense_0", "LayerNormMLP_0", "torso"]  # torso: MinAtar's small CNN
  assert sorted(params["params"]["torso"]) == ["Conv_0", "Dense_0"]
  assert sorted(params["params"]["LayerNormMLP_0"]) == ["Dense_0", "LayerNorm_0"]
  assert networks.apply(params, np.zeros((2, 10, 10, 4), np.uint8)).shape == (2, 3)


def test_policy_is_epsilon_greedy_on_its_schedule_and_greedy_in_evaluation():
  cfg = pqn.Config(hidden_sizes=(16,), epsilon_decay_steps=1_000, epsilon_final=0.0)
  networks = pqn.make_networks(SPEC, cfg)
  params = networks.init(jax.random.PRNGKey(0))
  obs = np.random.default_rng(0).normal(size=(256, 4)).astype(np.float32)
  greedy = np.argmax(np.asarray(networks.apply(params, obs)), axis=-1)
  first = np.ones(256, bool)
  acting, evaluating = pqn.make_policy(networks, cfg), pqn.make_policy(networks, cfg, evaluation=True)
  state = acting.init(jax.random.PRNGKey(1), 256)
  action, extras, state = acting.select_action(params, obs, first, state)  # epsilon 1: uniform
  assert extras == {} and action.dtype == np.int32 and action.shape == (256,)
  assert 0.3 < np.mean(np.asarray(action) == greedy) < 0.7 and int(state.env_steps) == 256
  state = state._replace(env_steps=np.int32(1_000))  # decayed to epsilon_final 0: greedy
  action, _, _ = acting.select_action(params, obs, first, state)
  np.testing.assert_array_equal(action, greedy)
  action, _, _ = evaluating.select_action(params, obs, first, evaluating.init(jax.random.PRNGKey(2), 256))
  np.testing.assert_array_equal(action, greedy)


def test_config_and_networks_name_what_is_wrong():
  with pytest.raises(ConfigError, match=r"^num_minibatches: must divide batch_size x sequence_length \(256\)"):
    pqn.Config(num_minibatches=3)
  with pytest.raises(ConfigError, match=r"^q_lambda: must be in \[0, 1\], got 1.5"):
    pqn.Config(q_lambda=1.5)
  box = EnvSpec((3,), np.dtype(np.float32), (1,), np.dtype(np.float32))
  with pytest.raises(ConfigError, match=r"^agent: pqn needs a Discrete action space, the env has a continuous one"):
    pqn.make_networks(box, pqn.Config())


def test_a_continuous_env_is_refused_in_one_line(tmp_path):
  out = subprocess.run([sys.executable, "-m", "launch.train", "--agent", "pqn", "--env", "Pendulum-v1", "--run_dir",
                        str(tmp_path / "never")], cwd=ROOT, text=True, capture_output=True, timeout=180)
  lines = [line for line in out.stderr.splitlines() if line.strip()]
  assert out.returncode == 2, out.stderr
  assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
  assert lines[0].startswith("python -m launch.train: error: agent: pqn needs a Discrete action space"), lines
  assert not (tmp_path / "never").exists()


@pytest.mark.needs_reverb
def test_pqn_through_a_reverb_queue(tmp_path):
  """No extras: the queue's items hold an empty extras dict, and every trajectory is used once."""
  from jrl.run.embedded import run
  exp = ExperimentConfig(agent="pqn", seed=0, steps=4_096, eval_every=2_048, eval_episodes=2,
                         run_dir=str(tmp_path / "pqnq"), progress_seconds=0)
  cfg = pqn.Config()
  summary = run(exp, cfg)
  assert summary["replay"] == "reverb"
  assert summary["learner_steps"] == 4_096 // (8 * cfg.sequence_length)


@pytest.mark.slow
def test_defaults_reach_475_on_cartpole_within_100k_steps(tmp_path):
  """Seed 0, deterministic replay."""
  from jrl.run.embedded import run
  exp = ExperimentConfig(agent="pqn", env="CartPole-v1", seed=0, steps=100_000, deterministic=True,
                         stop_at_threshold=True, eval_every=5_000, run_dir=str(tmp_path / "pqn"), progress_seconds=0)
  summary = run(exp, pqn.Config())
  assert summary["steps_to_threshold"] is not None and summary["steps_to_threshold"] <= 100_000, summary
  assert summary["best_eval_return"] >= 475


@pytest.mark.slow
@pytest.mark.needs_gymnax
def test_defaults_reach_475_on_gymnax_cartpole_on_device_within_100k_steps(tmp_path):
  """Seed 0, the device backend's defaults (8 envs)."""
  from jrl.run.device.runner import run_device
  exp = ExperimentConfig(agent="pqn", env="gymnax:CartPole-v1", backend="device", seed=0, steps=100_000,
                         eval_every=5_000, stop_at_threshold=True, run_dir=str(tmp_path / "pqn"), progress_seconds=0)
  summary = run_device(exp, pqn.Config())
  assert summary["steps_to_threshold"] is not None and summary["best_eval_return"] >= 475, summary
  assert summary["details"]["loop_compiles"] == 0
