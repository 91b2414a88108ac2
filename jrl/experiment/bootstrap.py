"""rliable's stratified bootstrap, every resample at once.

rliable (`library.get_interval_estimates`, through arch's `IIDBootstrap.conf_int`) draws one
resample at a time and calls the metric on it in Python, 50,000 times for each of a sweep report's
intervals: host work at the end of every sweep, whatever its number of runs (the performance page
has its seconds). Here the resampling indices of all resamples are one draw and the metrics take
the whole batch ([reps, runs, tasks, ...]) in numpy. The numbers are rliable's to the bit: the
same indices in the same order (rliable draws them from numpy's global RNG with
`np.random.choice`; one call for every resample yields what one call per resample yields), the
same metric arithmetic per resample, and arch's percentile interval (`np.percentile` at 100 *
alpha and 100 * (1 - alpha)).
`tests/test_bootstrap.py` holds them equal to rliable's on fixed matrices.

  point, low, high = interval(scores, iqm, reps=50_000, seed=0)    # scores: [runs, tasks]
"""

from typing import Callable, Tuple

import numpy as np

# Resamples drawn and measured per batch: bounds the memory of a large matrix's bootstrap
# (reps x runs x tasks x ... float64) without changing a number.
BATCH_ELEMENTS = 1 << 24

Metric = Callable[[np.ndarray], np.ndarray]  # [reps, runs, tasks, ...] -> [reps, params]


def iqm(batch: np.ndarray) -> np.ndarray:
  """rliable's `aggregate_iqm` (scipy's 25% trimmed mean over every score of a resample), per resample: [reps, 1]."""
  from scipy import stats
  flat = batch.reshape(batch.shape[0], -1)
  return stats.trim_mean(flat, proportiontocut=0.25, axis=1)[:, None]


def mean(batch: np.ndarray) -> np.ndarray:
  """rliable's `aggregate_mean` (each task's mean over runs, then their mean), per resample: [reps, 1]."""
  return np.mean(np.mean(batch, axis=1), axis=1)[:, None]


def iqm_per_step(batch: np.ndarray) -> np.ndarray:
  """The IQM over runs and tasks at each step of a [reps, runs, tasks, T] batch: [reps, T]."""
  from scipy import stats
  reps, steps = batch.shape[0], batch.shape[-1]
  by_step = np.moveaxis(batch, -1, 1).reshape(reps, steps, -1)
  return stats.trim_mean(by_step, proportiontocut=0.25, axis=2)


def fraction_above(taus: np.ndarray) -> Metric:
  """rliable's score distribution (the fraction of all scores above each tau), per resample: [reps, taus]."""
  taus = np.asarray(taus)

  def metric(batch: np.ndarray) -> np.ndarray:
    flat = batch.reshape(batch.shape[0], -1)
    return np.mean(flat[:, :, None] > taus[None, None, :], axis=1)

  return metric


def resamples(scores: np.ndarray, reps: int, rng: np.random.RandomState) -> np.ndarray:
  """`reps` stratified resamples of `scores` [runs, tasks, ...]: within each task (and further
  axis) the runs drawn with replacement, as rliable's `StratifiedBootstrap.update_indices` draws
  them: [reps, runs, tasks, ...]."""
  runs = scores.shape[0]
  indices = rng.choice(runs, (reps, *scores.shape), replace=True)
  strata = np.ogrid[tuple(slice(n) for n in scores.shape[1:])]
  return scores[(indices, *(s[None, None] for s in strata))]


def estimates(scores: np.ndarray, metric: Metric, reps: int, seed: int) -> np.ndarray:
  """The metric of each of `reps` resamples, [reps, params], drawn from numpy's legacy RNG seeded with `seed`."""
  scores = np.asarray(scores)
  rng = np.random.RandomState(seed)
  per_batch = max(1, BATCH_ELEMENTS // max(1, scores.size))
  parts = []
  for start in range(0, reps, per_batch):
    parts.append(np.asarray(metric(resamples(scores, min(per_batch, reps - start), rng)), dtype=np.float64))
  return np.concatenate(parts).reshape(reps, -1)


def percentile_interval(results: np.ndarray, size: float) -> Tuple[np.ndarray, np.ndarray]:
  """arch's two-sided percentile interval of each column of `results` [reps, params]: (low, high)."""
  alpha = (1.0 - size) / 2
  low, high = np.empty(results.shape[1]), np.empty(results.shape[1])
  for i in range(results.shape[1]):
    low[i], high[i] = np.percentile(results[:, i], [100 * alpha, 100 * (1.0 - alpha)])
  return low, high


def interval(scores: np.ndarray, metric: Metric, reps: int, seed: int = 0,
             size: float = 0.95) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(point, low, high), each [params]: `metric` of `scores` [runs, tasks, ...] and its
  percentile interval of coverage `size` over `reps` stratified resamples (bootstrap seed `seed`)."""
  scores = np.asarray(scores, dtype=np.float64)
  point = np.asarray(metric(scores[None]), dtype=np.float64)[0]
  low, high = percentile_interval(estimates(scores, metric, reps, seed), size)
  return point, low, high
