"""The device run's host schedule (`jrl.run.device.runner.schedule_chunk`): where a chunk's metric
rows and evaluations fall, computed ahead from the run core's marks, against hand-worked
chunks; the learner-call schedule against `calls_due` count by count; the threshold in float32."""

import json

import numpy as np
import pytest

from jrl.replay.kinds import ItemKind, ReplayedSequences, Transitions
from jrl.replay.spec import ReplaySpec

pytestmark = pytest.mark.needs_gymnax  # jrl.run.device imports gymnax


def _plan(iteration_steps=8, chunk_iterations=100, eval_every=2_500, log_every=1_000, num_envs=8):
  from jrl.run.device.loop import Plan, marks_within
  span = iteration_steps * chunk_iterations
  evals = min(chunk_iterations, marks_within(span, eval_every) + 1)
  rows = min(chunk_iterations, marks_within(span, log_every))
  return Plan(Transitions(), num_envs, 1, 1, 0, iteration_steps, chunk_iterations, evals, rows)


def _schedule(plan, env_steps, budget, next_log, next_eval, checkpoint_at=None, log_every=1_000, eval_every=2_500,
              iterations=None):
  from jrl.run.device.runner import schedule_chunk
  calls = lambda vector_steps, n: np.zeros(n, np.int32)
  return schedule_chunk(plan, calls, env_steps // plan.num_envs, env_steps, budget, next_log, log_every, next_eval,
                        eval_every, checkpoint_at, iterations)


def test_rows_and_evaluations_fall_after_the_iteration_that_first_reaches_each_mark():
  # 8 env steps an iteration from 0: 1,000 is first reached after iteration 124 (1,000 steps), 2,000 after
  # 249; the chunk's 100 iterations reach neither, so a chunk of 300 does.
  plan = _plan(chunk_iterations=300)
  s = _schedule(plan, 0, 100_000, 1_000, 2_500)
  assert s.iterations == 300 and s.rows == (124, 249) and s.evals == ()
  assert s.events == (124, 249)
  # Rows: iterations 0-124 end the open row, 125-249 make row 1, 250-299 open the next.
  assert s.inputs.row[0] == 0 and s.inputs.row[124] == 0 and s.inputs.row[125] == 1
  assert s.inputs.row[249] == 1 and s.inputs.row[250] == 2 and s.inputs.row[299] == 2
  assert (s.inputs.eval_slot == -1).all() and int(s.inputs.iterations) == 300
  # From 2,400 steps: 2,500 is reached after 13 iterations (2,504), 3,000 after 75 (3,000).
  s = _schedule(plan, 2_400, 100_000, 3_000, 2_500)
  assert s.evals == (12,) and s.rows == (74, 199) and s.events == (12, 74, 199)
  assert s.inputs.eval_slot[12] == 0 and (np.delete(s.inputs.eval_slot, 12) == -1).all()


def test_an_iteration_past_several_marks_cuts_one_row_and_the_next_mark_is_past_it():
  # 2,048 env steps an iteration (PPO's), rows every 1,000: each iteration passes two or three marks.
  plan = _plan(iteration_steps=2_048, chunk_iterations=4, num_envs=4)
  s = _schedule(plan, 0, 100_000, 1_000, 2_500)
  assert s.rows == (0, 1, 2, 3) and s.evals == (1, 2, 3)  # 2,048 < 2,500 <= 4,096; 5,000 <= 6,144; 7,500 <= 8,192


def test_a_chunk_ends_at_the_budget_with_an_evaluation_of_the_final_parameters():
  plan = _plan(chunk_iterations=300)
  s = _schedule(plan, 9_600, 10_000, 10_000, 12_500)
  assert s.iterations == 50 and s.rows == (49,) and s.evals == (49,)  # 10,000 exactly: the last iteration
  s = _schedule(plan, 9_600, 10_003, 10_000, 10_000)
  assert s.iterations == 51 and s.rows == (49,) and s.evals == (49, 50)  # an evaluation at 10,000 and at the end


def test_a_chunk_runs_the_iterations_asked_for_within_its_plan():
  plan = _plan(chunk_iterations=300)
  assert _schedule(plan, 0, 100_000, 1_000, 2_500, iterations=40).iterations == 40
  assert _schedule(plan, 0, 100_000, 1_000, 2_500, iterations=4_000).iterations == 300
  assert int(_schedule(plan, 0, 100_000, 1_000, 2_500, iterations=7).inputs.iterations) == 7


def test_chunks_are_sized_to_their_seconds_growing_at_most_eightfold():
  from jrl.run.device.loop import CHUNK_SECONDS, FIRST_CHUNK_SHARE
  from jrl.run.device.runner import ChunkSizer
  plan = _plan(chunk_iterations=16_384)
  sizer = ChunkSizer(plan, 500_000)
  assert sizer.next == int(500_000 * FIRST_CHUNK_SHARE) // 8 == 976
  sizer.ran(976, 0.1)  # 9,760 iterations a second: 8 x 976 at most
  assert sizer.next == 8 * 976
  sizer.ran(4_096, 2.0 * CHUNK_SECONDS)  # 2,048 a second
  assert sizer.next == 2_048
  sizer.ran(2_048, 1e3)
  assert sizer.next == 2  # slow: at least one
  sizer.ran(1, 1e-9)
  assert sizer.next == 16  # eightfold at most
  sizer.ran(16, 1e-9)
  assert sizer.next == 128
  fixed = ChunkSizer(plan._replace(fixed=True), 500_000)
  fixed.ran(10, 100.0)
  assert fixed.next == 16_384


def test_a_chunk_ends_where_a_checkpoint_falls_due_by_steps():
  plan = _plan(chunk_iterations=300)
  s = _schedule(plan, 0, 100_000, 1_000, 2_500, checkpoint_at=1_024)
  assert s.iterations == 128 and s.rows == (124,) and s.evals == ()
  assert _schedule(plan, 0, 2_000, 1_000, 2_500, checkpoint_at=4_096).iterations == 250  # past the budget: ignored


def test_the_schedule_agrees_with_the_run_cores_marks_applied_one_iteration_at_a_time():
  """The host's rule as the run core applies it after every iteration (`next_mark`), against the
  schedule's marks worked out ahead, over many chunk shapes."""
  from jrl.run.core import next_mark
  rng = np.random.default_rng(0)
  for _ in range(200):
    it, n = int(rng.choice([4, 8, 128, 2_048])), int(rng.integers(1, 400))
    log_every, eval_every = int(rng.integers(1, 5_000)), int(rng.integers(1, 20_000))
    start = it * int(rng.integers(0, 50))
    next_log = next_mark(start, 0, log_every) if start else log_every
    next_eval = next_mark(start, 0, eval_every) if start else eval_every
    plan = _plan(it, n, eval_every, log_every)
    s = _schedule(plan, start, 10**9, next_log, next_eval, log_every=log_every, eval_every=eval_every)
    rows, evals = [], []
    for i in range(n):
      steps = start + (i + 1) * it
      if steps >= next_log:
        rows.append(i)
        next_log = next_mark(steps, next_log, log_every)
      if steps >= next_eval:
        evals.append(i)
        next_eval = next_mark(steps, next_eval, eval_every)
    assert s.rows == tuple(rows) and s.evals == tuple(evals), (it, n, log_every, eval_every, start)


@pytest.mark.parametrize("kind", [Transitions(n_step=3), ReplayedSequences(sequence_length=20, sequence_period=10)])
@pytest.mark.parametrize("samples_per_insert", [32.0, 0.5, 7.3, 1 / 3, 4])
def test_the_learner_call_schedule_is_calls_due_count_by_count(kind, samples_per_insert):
  """The chunk's calls due, computed for all its iterations at once, are `calls_due`'s, taken one
  iteration at a time (its float and integer arithmetic, elementwise)."""
  spec = ReplaySpec(min_size=257, samples_per_insert=samples_per_insert, kind=kind)
  for start in (0, 5, 1_000, 12_345):
    got = kind.device_call_schedule(spec, start, 500, 3, 8, 4 * 64)
    owed = [ItemKind.calls_due(kind, spec, int(kind.device_rows_written(start + i * 3, 8)), 4 * 64) for i in range(501)]
    assert np.array_equal(got, np.diff(owed)) and got.sum() > 0


def test_the_threshold_in_float32_decides_as_the_host_does():
  from jrl.run.device.runner import float32_at_least
  for threshold in (475.0, 195.5, -200.3, 0.1, 1e-8, 123456.789):
    bound = float32_at_least(threshold)
    below = np.nextafter(bound, np.float32(-np.inf))
    assert float(bound) >= threshold and float(below) < threshold, threshold


def test_a_sweeps_books_after_a_chunk_follow_the_histories_rule():
  """The books a vmapped sweep keeps from a chunk's outputs (so that its next chunk need not wait
  for the runs' own books): evaluations counted on, the best as EvalHistory.record's rule: the
  first evaluation is the best whatever its mean (run 0's -2, below the books' 0.0 placeholder),
  later ones when above it. Hand-worked: run 1 keeps 5.0 against 4.0 and takes 6.0."""
  from jrl.run.device.loop import EvalBooks
  from jrl.run.device.sweep import books_after
  from jrl.experiment.bookkeeping import EvalHistory
  books = EvalBooks(np.zeros((3, 2), np.uint32), np.array([0, 3, 1], np.int32), np.array([0.0, 5.0, 7.0], np.float32),
                    np.full(3, np.inf, np.float32))
  means = np.array([[-2.0, -3.0, 9.0], [4.0, 6.0, 9.0], [7.0, 7.5, 9.0]], np.float32)  # slot 2 not made
  after = books_after(books, 2, means)
  np.testing.assert_array_equal(after.first_index, [2, 5, 3])
  np.testing.assert_array_equal(after.best, np.array([-2.0, 6.0, 7.5], np.float32))
  assert after.best.dtype == np.float32 and after.first_index.dtype == np.int32
  history = EvalHistory(None)  # the host's own rule, on run 0's means
  for mean in means[0, :2]:
    history.record(0, np.array([mean]), mean=float(mean))
  assert np.float32(max(history.returns)) == after.best[0]
  assert books_after(books, 0, means).best.tolist() == books.best.tolist()


def test_one_chunk_of_two_runs_books_each_runs_rows_and_evaluations_as_hand_worked(tmp_path):
  """`account_chunk` on a hand-made chunk of two runs (4 iterations of 100 env steps, rows after
  iterations 1 and 3, evaluations after 2 and 3, 2 s on the device; run 0 had an open row of one
  episode and one learner call): each run's CSV rows, evaluations, best policy and books, worked
  out by hand from the chunk's sums. A best the device saw that the host's history does not is
  an error."""
  import csv
  import types
  from jrl.agents import dqn
  from jrl.experiment.config import ExperimentConfig
  from jrl.run.core import RunCore
  from jrl.run.device.loop import ChunkOutputs, Plan
  from jrl.run.device.runner import ChunkSchedule, SeedHost, account_chunk
  plan = Plan(Transitions(), 4, 1, 1, 0, 100, 8, 2, 2)
  stats = {"return_sum": np.float32, "episodes": np.int32, "length_sum": np.int32, "calls": np.int32,
           "loss": np.float32}
  loop = types.SimpleNamespace(updates_per_call=2, metric_keys=("loss",), stat_dtypes=lambda: stats)
  hosts, cores = [], []
  for run in (0, 1):
    exp = ExperimentConfig(agent="dqn", env="gymnax:CartPole-v1", backend="device", steps=10_000, log_every=200,
                           eval_every=300, eval_episodes=2, seed=run, progress_seconds=0,
                           run_dir=str(tmp_path / f"r{run}"))
    core = RunCore(exp, dqn.Config(), None)
    core.open(0, f"r{run}")
    host = SeedHost()
    host._init_host(core, loop, plan)
    cores.append(core)
    hosts.append(host)
  hosts[0].pending = {"return_sum": 10.0, "episodes": 1, "length_sum": 10, "calls": 1, "loss": 0.5}
  cores[0].books.episodes_total = 1
  rows = {"return_sum": [[30, 20, 5], [12, 0, 7]], "episodes": [[3, 1, 0], [2, 0, 1]],
          "length_sum": [[30, 20, 5], [12, 0, 7]], "calls": [[3, 2, 1], [2, 2, 1]],
          "loss": [[1.5, 1.0, 0.25], [0.75, 0.5, 0.125]]}
  out = lambda best_slot: ChunkOutputs(
      {k: np.asarray(v, stats[k]) for k, v in rows.items()},
      np.asarray([[[1, 3], [5, 5]], [[8, 8], [4, 6]]], np.float32), np.asarray([[2, 5], [8, 5]], np.float32),
      {"calls": np.asarray([[3, 4], [3, 4]], np.int32), "episodes": np.asarray([[2, 3], [2, 2]], np.int32)},
      np.asarray(best_slot, np.int32), None, np.asarray([4, 4], np.int32))
  schedule = ChunkSchedule(4, (1, 3), (2, 3), (1, 2, 3), None)
  params = {"w": np.asarray([[1.0], [2.0]], np.float32)}
  account_chunk(hosts, cores, schedule, out([1, 0]), 2.0, [10.0, 20.0], lambda: params)
  for core, host in zip(cores, hosts):
    core.close(host)
  read = lambda run, role: [{k: float(v) for k, v in row.items()}
                            for row in csv.DictReader(open(tmp_path / f"r{run}" / "metrics" / f"{role}.csv"))]
  nan = float("nan")
  actor = lambda steps, episodes, ret, wall: {"actor_steps": steps, "episodes": episodes, "episode_return": ret,
                                              "episode_length": ret, "steps_per_second": 200.0, "wall_seconds": wall}
  learner = lambda steps, updates, loss, wall: {"actor_steps": steps, "learner_steps": updates, "loss": loss,
                                                "updates_per_second": 4.0, "wall_seconds": wall}
  evaluator = lambda steps, updates, mean, std, low, high, wall: {
      "actor_steps": steps, "learner_steps": updates, "eval_return": mean, "eval_return_std": std,
      "eval_return_min": low, "eval_return_max": high, "wall_seconds": wall}
  assert read(0, "actor") == [actor(200, 3, 10.0, 11.0), actor(400, 4, 20.0, 12.0)]
  got = read(1, "actor")
  assert got[0] == actor(200, 2, 6.0, 21.0) and np.isnan(got[1].pop("episode_return"))
  assert np.isnan(got[1].pop("episode_length")) and got[1] == {"actor_steps": 400, "episodes": 2,
                                                               "steps_per_second": 200.0, "wall_seconds": 22.0}
  assert read(0, "learner") == [learner(200, 4, 0.5, 11.0), learner(400, 8, 0.5, 12.0)]
  assert read(1, "learner") == [learner(200, 4, 0.375, 21.0), learner(400, 8, 0.25, 22.0)]
  assert read(0, "evaluator") == [evaluator(300, 6, 2.0, 1.0, 1.0, 3.0, 11.5), evaluator(400, 8, 5.0, 0.0, 5.0, 5.0, 12.0)]
  assert read(1, "evaluator") == [evaluator(300, 6, 8.0, 0.0, 8.0, 8.0, 21.5),
                                  evaluator(400, 8, 5.0, 1.0, 4.0, 6.0, 22.0)]
  for run, (index, steps, mean) in enumerate([(1, 400, 5.0), (0, 300, 8.0)]):
    best = json.loads((tmp_path / f"r{run}" / "policies" / "best.json").read_text())
    assert (best["eval_index"], best["actor_steps"], best["eval_return"]) == (index, steps, mean), best
  for run, (host, core) in enumerate(zip(hosts, cores)):
    assert (host.env_steps, host.vector_steps, host.learner_steps, host.device_evaluations) == (400, 100, 10, 2)
    assert (core.books.next_log, core.books.next_eval, core.books.last_eval_steps) == (600, 600, 400)
    assert core.books.history.returns == [[2.0, 5.0], [8.0, 5.0]][run]
    assert core.books.episodes_total == [4, 3][run] and host.row_mark == (2.0, 400, 8)
  assert hosts[0].pending == {"return_sum": 5.0, "episodes": 0, "length_sum": 5, "calls": 1, "loss": 0.25}
  with pytest.raises(AssertionError, match="evaluation 1 of the chunk: best on device"):
    account_chunk(hosts[1:], cores[1:], schedule, jax_free_run(out([1, 1]), 1), 2.0, [20.0], lambda: params)


def jax_free_run(out, i):
  """Run i's part of a ChunkOutputs of numpy arrays, keeping the runs axis (a sweep of one)."""
  part = lambda x: None if x is None else x[i:i + 1]
  return out._replace(rows={k: part(v) for k, v in out.rows.items()}, eval_returns=part(out.eval_returns),
                      eval_means=part(out.eval_means), eval_counts={k: part(v) for k, v in out.eval_counts.items()},
                      best_slot=part(out.best_slot), iterations=part(out.iterations))
