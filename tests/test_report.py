"""The run report: phase timers, the bottleneck verdict, and real runs that it names right."""

import json
import os
import time

import gymnasium as gym
import pytest
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

from jrl.agents import dqn
from jrl import timing
from jrl.experiment import report
from jrl.experiment.config import ExperimentConfig
from jrl.run.embedded import run
from jrl.timing import NodeTimes, PhaseTimer


class FakeClock:
  def __init__(self):
    self.now = 0.0

  def __call__(self):
    return self.now

  def tick(self, seconds):
    self.now += seconds


def test_timer_attributes_every_instant_to_one_phase():
  clock = FakeClock()
  timer = PhaseTimer(clock=clock).start()
  clock.tick(1)                     # other
  timer.enter("policy")
  clock.tick(2)
  timer.enter("param_fetch")        # nested: exclusive of policy
  clock.tick(3)
  timer.exit()
  clock.tick(4)                     # policy again
  timer.switch("env")
  clock.tick(5)
  timer.exit()
  clock.tick(6)                     # other
  with timer.phase("eval"):
    clock.tick(7)
  timer.stop()
  clock.tick(100)                   # after stop: not counted
  assert timer.totals() == {"other": 7, "policy": 6, "param_fetch": 3, "env": 5, "eval": 7}
  assert timer.wall() == 28 == sum(timer.totals().values())
  assert timer.calls == {"param_fetch": 1, "policy": 1, "env": 1, "eval": 1}


def test_timer_totals_while_running_and_moved_compile_time():
  clock = FakeClock()
  timer = PhaseTimer(clock=clock).start()
  timer.enter("update")
  clock.tick(5)
  timer.move(2, timing.COMPILE)     # learnt after the fact, while `update` is still open
  assert timer.totals() == {"update": 3, "compile": 2}
  assert sum(timer.totals().values()) == timer.wall() == 5


def test_compile_intervals_are_counted_once_when_nested():
  clock = FakeClock()
  timer = PhaseTimer(clock=clock).start()
  timer.enter("policy")
  clock.tick(10)
  watch = timing._CompileWatch(timer)
  watch.add(end=3.0, duration=1.0)   # inner jit traced inside the outer trace [0, 4]
  watch.add(end=4.0, duration=4.0)   # outer trace
  watch.add(end=6.0, duration=2.0)   # backend compile after it
  assert timer.totals()[timing.COMPILE] == pytest.approx(6.0)
  assert timer.totals()["policy"] == pytest.approx(4.0)


def test_null_timer_has_the_timer_interface_and_keeps_nothing():
  """Shells default to NULL_TIMER: it must take every call a PhaseTimer takes, return what a
  PhaseTimer returns, let exceptions through its phases, and hold no state to record in."""
  timer = timing.NULL_TIMER
  for name in ("enter", "switch", "exit", "phase"):
    assert callable(getattr(timing.PhaseTimer, name)) and callable(getattr(timer, name)), name
  assert (timer.enter("env"), timer.switch("policy"), timer.exit()) == (None, None, None)
  with pytest.raises(ZeroDivisionError):
    with timer.phase("eval"):
      1 / 0
  assert not hasattr(timer, "__dict__") and type(timer).__slots__ == ()


def _node(name, role, wall, helper=False, **phases):
  return NodeTimes(name, role, phases, wall, helper=helper)


def test_verdict_of_a_serial_run_is_its_largest_phase_compile_aside():
  nodes = [_node("main", "embedded", 10, env=5, policy=1, update=2, compile=2)]
  result = report.verdict(nodes)
  assert (result.bottleneck, result.node, result.phase) == ("env", "main", "env")
  assert result.share == 0.5 and result.advice.startswith("env-bound: 50% of main time steps the envs")
  heavy_compile = report.verdict([_node("main", "embedded", 10, env=1, update=3, compile=6)])
  assert heavy_compile.bottleneck == "learner" and "JIT compilation took another 60%" in heavy_compile.advice


def test_verdict_when_the_learner_waits_for_batches_names_replay():
  nodes = [_node("main", "embedded", 10, env=1, update=2, sample_wait=7),
           _node("prefetch", "sampler", 10, helper=True, sample=8, assemble=1, queue_wait=1)]
  result = report.verdict(nodes)
  assert result.bottleneck == "replay" and result.node == "main"
  assert "waits for learner batches" in result.advice and "prefetch samples replay 80%" in result.advice


def test_verdict_of_a_distributed_run_finds_the_stage_that_does_not_wait():
  learner_bound = [_node("actor/0", "actor", 10, env=0.5, policy=0.2, insert=0.1, rate_limit_wait=9.2),
                   _node("actor/1", "actor", 10, env=0.5, policy=0.2, insert=0.1, rate_limit_wait=9.2),
                   _node("learner", "learner", 10, update=9.5, sample_wait=0.5)]
  result = report.verdict(learner_bound)
  assert result.bottleneck == "learner" and result.node == "learner"
  assert "actor waits on replay's rate limiter 92% of its time" in result.advice
  assert "--updates_per_call" in result.advice
  actor_bound = [_node("actor/0", "actor", 10, env=8, policy=1.5, insert=0.5),
                 _node("learner", "learner", 10, update=3, sample_wait=7)]
  assert report.verdict(actor_bound).bottleneck == "env"
  server_bound = [_node("actor/0", "actor", 10, env=1, inference_wait=9),
                  _node("inference/0", "inference", 10, policy=9.5, idle=0.5)]
  assert report.verdict(server_bound).bottleneck == "inference"  # the server's own policy work


def test_report_text_and_summary_fields():
  nodes = [_node("main", "embedded", 4.0, env=3.0, update=0.9, other=0.1)]
  rates = {"env_steps_per_second": 500.0, "updates_per_second": 120.5, "samples_per_insert": None}
  result, text, fields = report.build_report(nodes, rates, title="T", extras={"policy lag": 1.5,
                                                                             "inference batch sizes": {1: 3, 2: 7}})
  assert text.startswith("# T\n") and "**bottleneck: env**" in text and result.advice in text
  assert "| env | 3.000 | 75.0% |" in text and "| env_steps_per_second | 500 |" in text
  assert "## inference batch sizes" in text and "| 2 | 7 |" in text
  assert fields["bottleneck"] == "env" and fields["phase_seconds"] == {"main": {"env": 3.0, "update": 0.9,
                                                                               "other": 0.1}}
  assert fields["rates"] == {"env_steps_per_second": 500.0, "updates_per_second": 120.5, "samples_per_insert": None}
  assert report.phases_add_up(nodes[0])


def test_nodes_travel_as_dicts_and_the_report_is_written(tmp_path):
  """What a distributed run does: nodes send their times, the launcher writes the report."""
  clock = FakeClock()
  timer = PhaseTimer(clock=clock).start()
  timer.enter("update")
  clock.tick(3)
  timer.switch("sample_wait")
  clock.tick(1)
  timer.exit()
  timer.stop()
  sent = json.loads(json.dumps(timer.node("learner", "learner").as_dict()))
  learner = NodeTimes.from_dict(sent)
  assert learner == timer.node("learner", "learner")
  actor = NodeTimes("actor/0", "actor", {"env": 1.0, "rate_limit_wait": 3.0}, 4.0)
  result, fields = report.write_report(str(tmp_path), [actor, learner], {"env_steps_per_second": 10.0}, title="T")
  assert result.bottleneck == "learner" and fields["bottleneck"] == "learner"
  assert "**bottleneck: learner**" in (tmp_path / "report.md").read_text()


class SlowCartPole(CartPoleEnv):
  """CartPole whose every step costs 2 ms more: an env-bound run."""

  def step(self, action):
    time.sleep(0.002)
    return super().step(action)


if "SlowCartPole-v1" not in gym.registry:
  gym.register("SlowCartPole-v1", entry_point=SlowCartPole, max_episode_steps=500, reward_threshold=475.0)

QUIET = dict(progress_seconds=0, checkpoint_every_seconds=0, eval_episodes=2, log_every=500)


def _check_run(summary):
  """report.md exists and names the bottleneck; the main thread's phases add up to the wall time."""
  run_dir = summary["run_dir"]
  text = open(os.path.join(run_dir, "report.md")).read()
  assert f"**bottleneck: {summary['bottleneck']}**" in text
  saved = json.load(open(os.path.join(run_dir, "summary.json")))
  for key in ("bottleneck", "bottleneck_advice", "phase_seconds", "rates"):
    assert key in saved, key
  assert {"env_steps_per_second", "updates_per_second", "samples_per_insert"} <= set(saved["rates"]), saved["rates"]
  main = summary["phase_seconds"]["main"]
  assert sum(main.values()) == pytest.approx(summary["wall_seconds"], rel=0.05), main
  # The verdict is the one its own recorded phases give (which phase wins depends on this machine's
  # speed at the time: the verdicts themselves are tested on fixed timings above).
  walls = summary["phase_wall_seconds"]
  nodes = [_node("main", "embedded", walls["main"], **main)]
  if "prefetch" in summary["phase_seconds"]:
    nodes.append(_node("prefetch", "sampler", walls["prefetch"], helper=True, **summary["phase_seconds"]["prefetch"]))
  assert report.verdict(nodes).bottleneck == summary["bottleneck"], (summary["bottleneck_advice"], main)
  return main


@pytest.mark.slow
def test_a_slow_env_makes_the_report_name_the_env(tmp_path):
  exp = ExperimentConfig(env="SlowCartPole-v1", steps=2_000, deterministic=True, eval_every=10**6,
                         run_dir=str(tmp_path / "slow-env"), **QUIET)
  summary = run(exp, dqn.Config(hidden_sizes=(32, 32), min_replay_size=500, samples_per_insert=16.0))
  main = _check_run(summary)
  assert main["env"] >= 2_000 * 0.002  # every env step slept 2 ms
  assert summary["rates"]["env_steps_per_second"] < 500  # 8 envs, 2 ms each per vector step: at most 500/s


@pytest.mark.slow
@pytest.mark.needs_reverb
def test_a_slow_learner_makes_the_report_name_the_learner(tmp_path):
  """A big network and one update per env step, through Reverb (the prefetch thread is reported too)."""
  exp = ExperimentConfig(steps=1_000, eval_every=10**6, run_dir=str(tmp_path / "slow-learner"), **QUIET)
  cfg = dqn.Config(hidden_sizes=(1024, 1024, 1024), batch_size=32, samples_per_insert=32.0, min_replay_size=400)
  summary = run(exp, cfg)
  main = _check_run(summary)
  assert set(summary["phase_seconds"]) == {"main", "prefetch"}
  prefetch = summary["phase_seconds"]["prefetch"]
  assert sum(prefetch.values()) == pytest.approx(summary["phase_wall_seconds"]["prefetch"], rel=0.05)
  # One update per env step once replay holds min_size transitions, as samples_per_insert asks.
  assert summary["rates"]["samples_per_insert"] == pytest.approx(32.0, rel=0.15)


def test_distributed_verdict_steady_state_leaves_compilation_out():
  """A server that compiled for most of a short run is not the busiest stage once compilation is left out."""
  nodes = [_node("actor/0", "actor", 10, env=6, insert=1, inference_wait=3),
           _node("inference/0", "inference", 10, compile=6, policy=1, idle=3)]
  result = report.verdict(nodes)
  assert (result.bottleneck, result.node) == ("env", "actor/0"), result


def test_distributed_verdict_names_round_trips_when_everyone_waits():
  """Shaped like a real 2-actor server run on a loaded machine: actors wait 70% on the server,
  which is itself idle most of the time; the learner waits for batches."""
  nodes = [_node("learner/0", "learner", 12.3, sample_wait=7.1, update=2.6, compile=2.5, other=0.1),
           _node("learner/0 prefetch", "sampler", 14.3, helper=True, sample=10.5, place=0.8, queue_wait=3.0),
           _node("actor/0", "actor", 12.9, env=0.13, policy=0.1, inference_wait=9.0, insert=0.32,
                 rate_limit_wait=3.24, other=0.07),
           _node("actor/1", "actor", 12.2, env=0.11, policy=0.08, inference_wait=8.46, insert=0.38,
                 rate_limit_wait=3.07, other=0.07),
           _node("inference/0", "inference", 11.8, policy=0.7, param_fetch=0.45, compile=2.6, collect=1.5,
                 reply=0.06, idle=6.5),
           _node("evaluator/0", "evaluator", 15.2, helper=True, eval=0.33, idle=12.3, other=1.7)]
  result = report.verdict(nodes)
  assert (result.bottleneck, result.node, result.phase) == ("inference", "actor", "inference_wait"), result
  assert result.share == pytest.approx(17.46 / 25.1, abs=1e-3)
  assert "round trips" in result.advice and "inference/0 itself waits" in result.advice
  # A busy server (its own work, not waiting) is named the inference bottleneck instead.
  busy_server = [_node("actor/0", "actor", 10, env=1, inference_wait=9),
                 _node("inference/0", "inference", 10, policy=6, reply=3, collect=1)]
  result = report.verdict(busy_server)
  assert (result.bottleneck, result.node, result.phase) == ("inference", "inference/0", "policy")
  assert "actor/0 waits on the inference server 90%" in result.advice and "round trips" not in result.advice


def test_verdict_says_when_the_nodes_saturate_the_machine():
  nodes = [_node(f"actor/{i}", "actor", 10, env=7, insert=2, rate_limit_wait=1) for i in range(3)]
  nodes.append(_node("learner/0", "learner", 10, update=9, sample_wait=1))
  assert report.busy_cores(nodes) == pytest.approx((3 * 9 + 9) / 10)
  assert "saturated" in report.verdict(nodes, cores=2).advice
  assert "saturated" not in report.verdict(nodes, cores=8).advice
  assert "saturated" not in report.verdict(nodes).advice


@pytest.mark.needs_reverb  # launch.distributed imports Launchpad
def test_distributed_report_inputs_merge_incarnations_and_rates():
  """What run_distributed makes of the nodes' books: a restarted actor's two incarnations are one
  node; env-steps/s per actor over its own wall time; histograms summed over nodes."""
  from jrl.run.distributed.program_report import report_inputs
  from jrl.replay.spec import ReplaySpec

  def book(node, **counts):
    return {"nodes": [node.as_dict()], **counts}

  books = [book(_node("actor/0", "actor", 10, env=8, insert=2), env_steps=1000, policy_lag={"0": 2, "3": 1}),
           book(_node("actor/0", "actor", 5, env=4, insert=1), env_steps=1000, policy_lag={"3": 1}),
           book(_node("actor/1", "actor", 10, env=9, insert=1), env_steps=3000),
           book(_node("learner/0", "learner", 20, update=15, sample_wait=5), updates=400, calls=100),
           book(_node("inference/0", "inference", 20, policy=5, idle=15), batch_sizes={"1": 2, "2": 6})]
  spec = ReplaySpec(block_size=1, max_size=1000, min_size=100, samples_per_insert=4.0)
  summary = {"actor_steps": 5000, "wall_seconds": 25.0,
             "details": {"replay_items_inserted": 1100, "replay_items_sampled": 4000}}
  nodes, rates, extras = report_inputs(books, summary, spec)
  assert [n.name for n in nodes] == ["learner/0", "actor/0", "actor/1", "inference/0"]
  actor0 = nodes[1]
  assert actor0.wall == 15 and actor0.phases == {"env": 12, "insert": 3}
  assert rates["env_steps_per_second"] == pytest.approx(2000 / 15 + 3000 / 10)
  assert rates["updates_per_second"] == 20 and rates["learner_calls_per_second"] == 5
  assert rates["samples_per_insert"] == pytest.approx(4000 / (1100 - 100))
  assert rates["run_env_steps_per_second"] == 200
  assert rates["inference_batch_mean"] == pytest.approx(14 / 8) and rates["policy_lag_mean"] == pytest.approx(6 / 4)
  assert list(extras)[:2] == ["inference batch sizes (requests per batch: batches)",
                              "policy lag (learner calls between the parameters an actor acts with and the "
                              "learner's, once a second per actor: samples)"]
  assert extras["inference batch sizes (requests per batch: batches)"] == {1: 2, 2: 6}
