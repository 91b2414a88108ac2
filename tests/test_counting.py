"""How a distributed program's actors count env steps against the budget (jrl.run.distributed.counter
`report_share`): actors learn the total only when they report, so the rule for when they report
decides how far past `--steps` a run goes. Simulated actors of fixed seeds and speeds, stepping
`num_envs` env steps at a time, report by the nodes' rule; the counter's total is checked against
the bound the rule promises."""

import heapq
from typing import List, Optional, Sequence, Tuple

import numpy as np
import pytest

from jrl.run.distributed.counter import report_share


def _counted(budget: int, speeds: Sequence[float], vector_steps: int,
             starts: Optional[Sequence[float]] = None) -> Tuple[float, float]:
  """Actors stepping at `speeds` (env steps per unit time) from `starts`, reporting by the rule
  alone (the once-a-second reports only make them report sooner), each stopping once a report
  tells it the budget is passed. (the counter's total at the report that passed the budget, its
  total when every actor has stopped)."""
  n = len(speeds)
  starts = list(starts) if starts is not None else [0.0] * n
  total, passed_at = 0.0, None
  counted, steps, reported = [0.0] * n, [0] * n, [0] * n
  events: List[Tuple[float, int]] = [(starts[i] + vector_steps / speeds[i], i) for i in range(n)]
  heapq.heapify(events)
  while events:
    now, i = heapq.heappop(events)
    steps[i] += vector_steps
    if steps[i] - reported[i] >= report_share(budget, counted[i], n):
      total += steps[i] - reported[i]
      reported[i], counted[i] = steps[i], total
      if total >= budget:
        passed_at = total if passed_at is None else passed_at
        continue  # this actor stops
    heapq.heappush(events, (now + vector_steps / speeds[i], i))
  return passed_at, total


def test_one_actor_reports_the_vector_step_that_reaches_the_budget():
  assert _counted(4000, [1.0], 8) == (4000, 4000)
  assert _counted(4001, [3.0], 8) == (4008, 4008)


@pytest.mark.parametrize("num_actors", [2, 4, 8])
def test_actors_of_any_speeds_end_below_the_bound_and_like_speeds_near_the_budget(num_actors):
  budget, vector_steps = 4000, 8
  bound = budget * (2 - 1 / num_actors) + num_actors * vector_steps
  rng = np.random.RandomState(num_actors)
  worst = 0.0
  for _ in range(300):
    speeds, starts = rng.uniform(0.05, 1.0, num_actors), rng.uniform(0.0, 2000.0, num_actors)
    passed_at, total = _counted(budget, speeds, vector_steps, starts)
    assert budget <= passed_at <= total <= bound, (speeds, starts, passed_at, total)
    worst = max(worst, total)
  assert worst > budget * 1.2  # the cases drawn come near the bound: the check is not idle
  # Actors stepping alike: the report that passes the budget passes it by at most a vector step.
  passed_at, total = _counted(budget, [1.0] * num_actors, vector_steps)
  assert budget <= passed_at <= budget + vector_steps * num_actors, passed_at


def test_an_actors_share_is_what_the_budget_has_left_over_the_actors():
  assert report_share(4000, 0.0, 2) == 2000.0 and report_share(4000, 3000.0, 2) == 500.0
  assert report_share(4000, 4100.0, 2) == 0.0  # passed: report at once
