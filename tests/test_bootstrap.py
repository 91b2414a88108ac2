"""jrl.experiment.bootstrap against rliable itself: the same numbers, to the bit, on fixed matrices
(rliable draws from numpy's global RNG: it is seeded as the report's bootstrap seed)."""

import numpy as np
import pytest
from rliable import library, metrics

from jrl.experiment import bootstrap


def _rliable(scores, metric, reps, seed):
  """rliable's point and 95% percentile interval, as arrays [params]."""
  np.random.seed(seed)
  points, cis = library.get_interval_estimates({"x": scores}, metric, reps=reps,
                                               random_state=np.random.RandomState(seed))
  low, high = np.asarray(cis["x"], np.float64).reshape(2, -1)
  return np.atleast_1d(np.asarray(points["x"], np.float64)), low, high


def _same(ours, theirs):
  for a, b in zip(ours, theirs):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("shape", [(16, 1), (5, 3), (8, 1), (2, 4)])
def test_iqm_and_mean_intervals_are_rliables(shape):
  scores = np.random.RandomState(sum(shape)).uniform(-50, 500, shape).round(1)
  for ours, theirs in ((bootstrap.iqm, metrics.aggregate_iqm), (bootstrap.mean, metrics.aggregate_mean)):
    _same(bootstrap.interval(scores, ours, reps=3000, seed=7), _rliable(scores, theirs, 3000, 7))


def test_the_curve_band_is_rliables_per_step_iqm():
  returns = np.random.RandomState(1).uniform(0, 500, (6, 1, 9)).round(1)  # [runs, tasks, evaluations]
  per_step = lambda x: np.array([metrics.aggregate_iqm(x[..., t]) for t in range(x.shape[-1])])  # noqa: E731
  _same(bootstrap.interval(returns, bootstrap.iqm_per_step, reps=1000, seed=0), _rliable(returns, per_step, 1000, 0))


@pytest.mark.parametrize("shape", [(10, 1), (4, 3)])  # one env's runs; an agent's runs over three envs
def test_the_performance_profile_is_rliables_score_distribution(shape):
  scores = np.random.RandomState(2).uniform(0, 500, shape).round(0)
  taus = np.linspace(0.0, 525.0, 22)
  np.random.seed(3)
  profile, cis = library.create_performance_profile({"x": scores}, taus, reps=1000)
  fraction, low, high = bootstrap.interval(scores, bootstrap.fraction_above(taus), reps=1000, seed=3)
  np.testing.assert_array_equal(fraction, profile["x"])
  np.testing.assert_array_equal(np.stack([low, high]), np.asarray(cis["x"]).reshape(2, -1))


def test_resamples_in_batches_are_those_drawn_at_once(monkeypatch):
  """A bootstrap larger than a batch draws the same indices, in the same order, over several
  batches (here 7 resamples a batch, 100 in all: the last batch is short)."""
  scores = np.arange(12.0).reshape(4, 3) ** 2
  whole = bootstrap.estimates(scores, bootstrap.iqm, reps=100, seed=5)
  monkeypatch.setattr(bootstrap, "BATCH_ELEMENTS", 7 * scores.size)
  np.testing.assert_array_equal(bootstrap.estimates(scores, bootstrap.iqm, reps=100, seed=5), whole)
  _same(bootstrap.interval(scores, bootstrap.iqm, reps=100, seed=5), _rliable(scores, metrics.aggregate_iqm, 100, 5))


def test_resamples_keep_each_task_to_its_own_runs():
  """Stratified: a resample's column j holds only column j's scores (by hand: column j is 10 * j + run)."""
  scores = np.array([[10.0 * j + r for j in range(3)] for r in range(4)])
  batch = bootstrap.resamples(scores, 50, np.random.RandomState(0))
  assert batch.shape == (50, 4, 3)
  for j in range(3):
    assert set(np.unique(batch[:, :, j])) <= {10.0 * j + r for r in range(4)}
  assert len(np.unique(batch[:, :, 0])) == 4  # every run is drawn somewhere in 50 resamples


def test_one_run_has_its_score_as_its_interval():
  point, low, high = bootstrap.interval(np.array([[42.0]]), bootstrap.iqm, reps=100, seed=0)
  assert (point[0], low[0], high[0]) == (42.0, 42.0, 42.0)
