"""IMPALA's V-trace wiring against rlax and by hand across an episode boundary."""

import jax
import numpy as np
import pytest
import rlax

from jrl.agents import impala
from jrl.agents.impala.learning import vtrace
from jrl.specs import EnvSpec
from jrl.types import LearnerBatch, Trajectory


def test_vtrace_without_boundaries_equals_rlax():
  rng = np.random.default_rng(0)
  t = 7
  values = rng.normal(size=t + 1).astype(np.float32)
  value, next_value = values[:-1], values[1:]
  reward = rng.normal(size=t).astype(np.float32)
  rho = rng.uniform(0.3, 2.0, size=t).astype(np.float32)
  ours = vtrace(value, next_value, reward, np.ones(t, np.float32), np.zeros(t, np.float32), rho, 0.9, 1.0, 1.0, 1.0)
  ref = rlax.vtrace_td_error_and_advantage(value, next_value, reward, np.full(t, 0.9, np.float32), rho,
                                           lambda_=1.0, clip_rho_threshold=1.0, clip_pg_rho_threshold=1.0)
  np.testing.assert_allclose(ours.errors, ref.errors, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(ours.pg_advantage, ref.pg_advantage, rtol=1e-5, atol=1e-6)


def test_vtrace_by_hand_across_a_truncation():
  # On-policy (rho = 1), gamma 0.9, lambda 1. Step 1 is truncated (final obs value 0.8);
  # step 2 starts a new episode and bootstraps from 0.2.
  value = np.array([0.5, 0.6, 0.1], np.float32)
  next_value = np.array([0.6, 0.8, 0.2], np.float32)
  reward = np.array([1.0, 2.0, 3.0], np.float32)
  end = np.array([0.0, 1.0, 0.0], np.float32)
  out = vtrace(value, next_value, reward, np.ones(3, np.float32), end, np.ones(3, np.float32), 0.9, 1.0, 1.0, 1.0)
  vs2 = 3 + 0.9 * 0.2                 # one-step target
  vs1 = 2 + 0.9 * 0.8                 # the trace is cut at the episode end
  vs0 = 1 + 0.9 * vs1                 # lambda 1 within the episode: Monte Carlo to the boundary
  np.testing.assert_allclose(out.errors, [vs0 - 0.5, vs1 - 0.6, vs2 - 0.1], rtol=1e-5)
  np.testing.assert_allclose(out.pg_advantage, [1 + 0.9 * vs1 - 0.5, 2 + 0.9 * 0.8 - 0.6, 3 + 0.9 * 0.2 - 0.1],
                             rtol=1e-5)


def test_update_reduces_the_loss_on_a_fixed_batch():
  spec = EnvSpec((4,), np.dtype(np.float32), (), np.dtype(np.int32), num_actions=2)
  cfg = impala.Config(hidden_sizes=(16,), sequence_length=8, batch_size=4)
  networks = impala.make_networks(spec, cfg)
  learner = impala.make_learner(networks, cfg)
  state = learner.init(jax.random.PRNGKey(0))
  rng = np.random.default_rng(1)
  obs = rng.normal(size=(4, 8, 4)).astype(np.float32)
  logits, _ = networks.apply(state.params, obs.reshape(-1, 4))
  traj = Trajectory(obs, rng.integers(0, 2, (4, 8)).astype(np.int32), rng.normal(size=(4, 8)).astype(np.float32),
                    np.ones((4, 8), np.float32), np.zeros((4, 8), np.float32),
                    rng.normal(size=(4, 8, 4)).astype(np.float32), {"logits": np.asarray(logits).reshape(4, 8, 2)})
  update = jax.jit(learner.update)
  state, first = update(state, LearnerBatch(traj, np.ones(4, np.float32)))
  assert float(first["rho_mean"]) == pytest.approx(1.0, abs=1e-5)  # on-policy at the first step
  for _ in range(20):
    state, metrics = update(state, LearnerBatch(traj, np.ones(4, np.float32)))
  assert float(metrics["baseline_loss"]) < float(first["baseline_loss"])
  assert update._cache_size() == 1
