"""The topology advisor's model, on hand-made costs; its measuring, briefly."""

import functools
import os
import pathlib
import re
import subprocess
import sys

import psutil
import pytest

from launch import advise
from launch.advise import Costs, Topology, Workload, at, predict, recommend

ROOT = pathlib.Path(__file__).resolve().parent.parent
MS = 1e-3
DQN = Workload(batch_size=128, samples_per_insert=128.0)  # one update per env step


def costs(env_per_env_ms=0.02, env_fixed_ms=0.05, policy_fixed_ms=0.1, policy_per_obs_ms=0.001, insert_us=5.0,
          update_ms=0.5, call_ms=0.3, sample_ms=0.2, cores=8.0):
  """Costs shaped like the measured ones: a fixed part per call plus a part per item."""
  return Costs(
      env={n: (env_fixed_ms + env_per_env_ms * n) * MS for n in (1, 2, 4, 8, 16, 32, 64)},
      policy={b: (policy_fixed_ms + policy_per_obs_ms * b) * MS for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)},
      insert={n: insert_us * n * 1e-6 for n in (1, 2, 4, 8, 16, 32, 64)},
      learner={u: (call_ms + update_ms * u) * MS for u in (1, 2, 4, 8, 16)},
      sample={u: sample_ms * u * MS for u in (1, 2, 4, 8, 16)},
      cores=cores, rpc=1 * MS)


def test_interpolation_and_extrapolation():
  table = {1: 1.0, 4: 4.0, 8: 6.0}
  assert at(table, 4) == 4.0 and at(table, 2) == pytest.approx(2.0) and at(table, 6) == pytest.approx(5.0)
  assert at(table, 16) == pytest.approx(10.0)  # the last slope, 0.5 per item
  assert at({8: 2.0}, 16) == pytest.approx(4.0)


def test_embedded_prediction_is_the_serial_sum_per_env_step():
  c = costs(cores=1.0)
  p = predict(c, DQN, Topology("embedded", 1, 8, 4))
  per_step = (c.env[8] + c.policy[8] + c.insert[8]) / 8 + (1 / 4) * (c.learner[4] + c.sample[4])  # 1 core: no overlap
  assert p.env_steps_per_second == pytest.approx(1 / per_step)
  assert p.bound == "learner"
  two_cores = predict(costs(cores=2.0), DQN, Topology("embedded", 1, 8, 4))
  assert two_cores.env_steps_per_second > p.env_steps_per_second  # sampling overlaps on the second core


def test_learner_bound_work_gains_from_larger_calls_and_not_from_actors():
  c = costs(update_ms=0.1, call_ms=1.0)  # call overhead dominates the update itself
  small = predict(c, DQN, Topology("actor", 4, 8, 1))
  large = predict(c, DQN, Topology("actor", 4, 8, 16))
  assert small.bound == "learner" and large.env_steps_per_second > 3 * small.env_steps_per_second
  assert predict(c, DQN, Topology("actor", 8, 8, 1)).env_steps_per_second == pytest.approx(
      small.env_steps_per_second)  # more actors do not help a learner-bound run


def test_env_bound_work_scales_with_actors_up_to_the_cores():
  c = costs(env_per_env_ms=1.0, update_ms=0.01, call_ms=0.01, sample_ms=0.01, cores=8.0)
  rates = {a: predict(c, DQN, Topology("actor", a, 8, 16)).env_steps_per_second for a in (1, 2, 4, 8, 16)}
  assert rates[2] == pytest.approx(2 * rates[1], rel=0.01) and rates[4] == pytest.approx(4 * rates[1], rel=0.01)
  assert predict(c, DQN, Topology("actor", 16, 8, 16)).bound == "cpu"
  assert rates[16] <= (8 - advise.SIDE_PROCESSES_CORES) * rates[1] * 1.01
  best, _ = recommend(c, DQN, max_actors=16)
  assert best.topology.placement == "actor" and best.topology.num_actors >= 6


def test_a_costly_policy_that_batches_well_favours_the_server_when_cores_are_short():
  c = costs(policy_fixed_ms=2.0, policy_per_obs_ms=0.001, env_per_env_ms=0.05, update_ms=0.001, call_ms=0.01,
            sample_ms=0.001, cores=4.0)
  actor = predict(c, DQN, Topology("actor", 16, 1, 16))
  server = predict(c, DQN, Topology("server", 16, 1, 16))
  assert actor.bound == "cpu" and server.env_steps_per_second > 2 * actor.env_steps_per_second
  plenty = costs(policy_fixed_ms=2.0, policy_per_obs_ms=0.001, env_per_env_ms=0.05, update_ms=0.001,
                 call_ms=0.01, sample_ms=0.001, cores=64.0)
  # With a core per actor, each actor's own policy call is faster than a round trip to a server.
  assert predict(plenty, DQN, Topology("actor", 16, 1, 16)).env_steps_per_second > predict(
      plenty, DQN, Topology("server", 16, 1, 16)).env_steps_per_second


def test_recommendation_prefers_the_simpler_topology_within_the_margin():
  c = costs(cores=2.0)
  best, ranked = recommend(c, DQN, max_actors=4, margin=0.15)
  assert best.env_steps_per_second >= 0.85 * ranked[0].env_steps_per_second
  simpler = [p for p in ranked if p.env_steps_per_second >= 0.85 * ranked[0].env_steps_per_second]
  assert best.topology.simplicity() == min(p.topology.simplicity() for p in simpler)
  only_embedded, _ = recommend(c, DQN, 4, allowed=lambda t: t.placement == "embedded")
  assert only_embedded.topology.placement == "embedded"


def test_on_policy_work_makes_one_call_per_batch_of_sequences():
  work = Workload(batch_size=64, samples_per_insert=1.0, sequence_length=128)
  assert work.calls_per_step(4) == work.calls_per_step(1) == pytest.approx(1 / (64 * 128))


def test_background_threads_count_against_the_cores():
  """Reverb's sampling threads and XLA's threads use CPU the main thread's wall time does not show."""
  c = costs(cores=2.0)
  wall_only = predict(c, DQN, Topology("embedded", 1, 8, 4))
  c.learner_cpu = {u: 3 * (v + c.sample[u]) for u, v in c.learner.items()}
  busy = predict(c, DQN, Topology("embedded", 1, 8, 4))
  assert busy.bound == "cpu" and busy.env_steps_per_second < wall_only.env_steps_per_second


def test_distributed_predictions_pay_for_replay_in_another_process():
  """Over gRPC the learner's calls and sampling cost more and the replay process burns CPU;
  an embedded run keeps the in-process figures."""
  c = costs(cores=4.0)
  topo = Topology("actor", 2, 8, 4)
  local = predict(c, DQN, topo)
  c.remote_learner = {u: 3 * v for u, v in c.learner.items()}
  c.remote_sample = {u: 2 * v for u, v in c.sample.items()}
  remote = predict(c, DQN, topo)
  assert remote.bound == "learner"
  assert remote.env_steps_per_second == pytest.approx(1 / (DQN.calls_per_step(4) * c.remote_learner[4]))
  assert remote.env_steps_per_second == pytest.approx(local.env_steps_per_second / 3)
  assert predict(c, DQN, Topology("embedded", 1, 8, 4)).env_steps_per_second == pytest.approx(
      predict(costs(cores=4.0), DQN, Topology("embedded", 1, 8, 4)).env_steps_per_second)
  c.replay_sample_cpu = {u: 20 * v for u, v in c.remote_learner.items()}  # the replay process's CPU counts too
  starved = predict(c, DQN, topo)
  assert starved.bound == "cpu" and starved.env_steps_per_second < remote.env_steps_per_second


def test_advise_without_reverb_measures_the_seeded_buffer_and_recommends_embedded_runs(monkeypatch, capsys):
  """A core install's advisor: no Reverb (importing it fails here), the seeded buffer of a --deterministic run."""
  from jrl import compat
  monkeypatch.setattr(compat, "missing_distributed_stack", lambda: compat.DISTRIBUTED_STACK)
  monkeypatch.setitem(sys.modules, "reverb", None)
  monkeypatch.setattr(advise, "measure", functools.partial(advise.measure, env_sizes=(1, 4), policy_sizes=(1, 4, 16),
                                                           updates=(1, 4)))
  assert advise.main(["--agent", "dqn", "--env", "CartPole-v1", "--seconds", "0.02"]) == 0
  out = capsys.readouterr().out
  assert f"distributed topologies need {compat.FULL_STACK_HINT}; this install lacks reverb, launchpad" in out
  assert "inference actor" not in out and "inference server" not in out and "replay process" not in out
  assert "accelerators: none, the CPU only: the figures above are what runs get." in out
  assert len([line for line in out.splitlines() if line.startswith("  learner:")]) == 2
  run = next(line for line in out.splitlines() if line.startswith("run it:"))
  assert "--deterministic" in run and "--distributed" not in run


@pytest.mark.slow
@pytest.mark.needs_reverb
def test_advise_measures_replay_in_a_process_of_its_own():
  from jrl.agents import get_agent
  lines = []
  c, work = advise.measure("dqn", "CartPole-v1", get_agent("dqn").Config(), seconds=0.2, env_sizes=(4,),
                           policy_sizes=(4,), updates=(4,), log=lines.append)
  assert c.prefetch and c.distributed and work.batch_size > 0
  for name in advise.REMOTE:
    assert getattr(c, "remote_" + name).keys() == getattr(c, name).keys()
  assert c.replay_insert_cpu[4] + c.replay_sample_cpu[4] > 0  # the replay process's own CPU (its clock: 10 ms ticks)
  assert all("replay process:" in line for line in lines if line.startswith(("  env", "  learner")))
  assert not [p for p in psutil.Process().children() if "_serve_replay" in " ".join(p.cmdline())]


def test_the_recommendation_reads_as_settings_to_run():
  assert advise.recommendation(Topology("embedded", 1, 8, 4)) == (
      "recommended: embedded (one process: no actors to count, the policy runs in it), num_envs 8, updates_per_call 4")
  assert advise.recommendation(Topology("server", 3, 2, 8)) == (
      "recommended: distributed, num_actors 3, inference server, num_envs 2, updates_per_call 8")


@pytest.mark.slow
@pytest.mark.needs_reverb
def test_advise_as_typed_prints_no_native_log_lines():
  """The docs' command (training.md), with a shorter --seconds: Reverb's C++ info lines, from this
  process's servers and the replay process's, once made 11 of its 45 lines; the embedded
  recommendation read `num_actors - (embedded)`."""
  result = subprocess.run([sys.executable, "-m", "launch.advise", "--agent", "dqn", "--env", "CartPole-v1",
                           "--seconds", "0.02"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"))
  output = result.stdout + result.stderr
  assert result.returncode == 0, output[-3000:]
  assert not [line for line in output.splitlines() if line.startswith("[reverb")], output
  assert "- (embedded)" not in output
  recommended = [line for line in result.stdout.splitlines() if line.startswith("recommended:")]
  assert len(recommended) == 1 and re.fullmatch(
      r"recommended: (embedded \(one process: no actors to count, the policy runs in it\)|"
      r"distributed, num_actors \d+, inference (actor|server)), num_envs \d+, updates_per_call \d+", recommended[0])
  assert "replay process:" in result.stdout  # the distributed figures were measured: Reverb ran in two processes


def test_the_advice_counts_the_hosts_accelerators():
  from jrl.accelerators import Accelerators
  embedded, actor = advise.Topology("embedded", 1, 8, 4), advise.Topology("actor", 4, 8, 4)
  cpu = advise.accelerator_advice(Accelerators(), actor)
  assert cpu == advise.accelerator_advice(Accelerators(), embedded) == [
      "accelerators: none, the CPU only. Inference stays in the actors (--inference actor): on CPU a central server "
      "reached only 0.53-0.68 of actor-local inference's env-steps/s in jrl's measurements (docs/performance.md); it "
      "pays off here only where the model above says so (cores short, policy costly)."]
  one = advise.accelerator_advice(Accelerators("cuda", 1), actor)
  assert one == [
      "accelerators: 1 cuda device. A distributed run puts the learner and an inference server on cuda:0, sharing "
      "its memory (actors, replay and the evaluator on the CPU; jrl.accelerators), where the server batches every "
      "actor's observations in one call: the SEED-style placement the figures above (measured on the CPU, where it "
      "lost to actor-local inference, 0.53-0.68) do not price.",
      "With a costly policy (a CNN on frames) try --inference server beside the recommendation: the server's batch "
      "of 4 x 8 observations runs on the GPU."]
  eight = advise.accelerator_advice(Accelerators("cuda", 8), embedded)
  assert eight[0].startswith("accelerators: 8 cuda devices. A distributed run puts the learner on cuda:0,1,2,3,4,5,6 "
                             "and an inference server on cuda:7 (actors")
  assert eight[1:] == [
      "An embedded run keeps the learner on the accelerator and acts on the CPU or the accelerator by the policy's "
      "size (--actor_device auto).",
      "With 8 devices each further inference server gets one of its own (--num_inference_servers; the learner keeps "
      "the rest, or --learner_devices of them)."]
  # An install without the distributed stack runs embedded only: nothing about actors or servers.
  assert advise.accelerator_advice(Accelerators(), embedded, distributed=False) == [
      "accelerators: none, the CPU only: the figures above are what runs get."]
  assert advise.accelerator_advice(Accelerators("cuda", 2), embedded, distributed=False) == [
      "accelerators: 2 cuda device(s). An embedded run keeps the learner on the accelerator and acts on the CPU or "
      "the accelerator by the policy's size (--actor_device auto)."]
