"""The device backend: n-step and sequence windows against the host adders, replay sampling, bad
input, PPO on gymnax CartPole to 475 with the run directory, R2D2 and an env of one's own learned,
determinism, chunking, resuming, launch.evaluate and 1 vs 2 devices."""

import csv
import dataclasses
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jrl.agents import dqn, ppo
from jrl.experiment.config import ExperimentConfig
from jrl.learners import sharding
from jrl.replay import on_device as device_replay
from jrl.replay.adders import NStepTransitionAdder
from jrl.types import Transition

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_nstep_window_emits_the_adders_transitions():
  """Same transitions as NStepTransitionAdder (terminations and truncations inside windows)."""
  num_envs, n, gamma, steps = 3, 3, 0.9, 40
  rng = np.random.default_rng(0)
  terminated = rng.random((steps, num_envs)) < 0.12
  truncated = (rng.random((steps, num_envs)) < 0.08) & ~terminated
  reward = rng.normal(size=(steps, num_envs)).astype(np.float32)
  obs = lambda t: np.stack([np.array([e, t], np.float32) for e in range(num_envs)])   # identifies (env, step)
  final = lambda t: obs(t) + np.float32(0.5)                                           # bootstrap obs after step t
  action = lambda t: np.full(num_envs, t % 2, np.int32)

  adder = NStepTransitionAdder(num_envs, n, gamma)
  expected = {}
  for t in range(steps):
    out = adder.add(obs(t), action(t), reward[t], terminated[t], truncated[t], final(t))
    for i in range(len(out.reward)):
      expected[tuple(out.observation[i])] = (out.reward[i], out.discount[i], tuple(out.next_observation[i]))

  window = device_replay.window_init(n, jnp.asarray(obs(0)), jnp.asarray(action(0)))
  add = jax.jit(device_replay.window_add, static_argnums=7)
  got = {}
  for t in range(steps):
    window, out, valid = add(window, obs(t), action(t), reward[t], terminated[t], truncated[t], final(t), gamma)
    if bool(valid):
      for i in range(num_envs):
        got[tuple(np.asarray(out.observation[i]))] = (float(out.reward[i]), float(out.discount[i]),
                                                      tuple(np.asarray(out.next_observation[i])))
  assert len(got) == num_envs * (steps - n + 1)
  for start, (r, d, nxt) in got.items():  # every emitted transition is the adder's
    er, ed, enxt = expected[start]
    assert r == pytest.approx(float(er), abs=1e-5) and d == pytest.approx(float(ed), abs=1e-6) and nxt == enxt, start
  assert all(k in got for k in expected if k[1] <= steps - n)  # and every one the adder wrote is emitted


def test_sequence_window_emits_the_host_adders_sequences_and_the_ring_keeps_them():
  """R2D2's items: the same overlapping sequences, at the same steps, as OverlappingSequenceAdder
  (episode ends inside them), and a full ring of sequences drops exactly its oldest."""
  from jrl.replay.sequence_adder import START_STATE_KEY, OverlappingSequenceAdder
  num_envs, length, period, steps = 3, 5, 2, 24  # the last step emits nothing
  rng = np.random.default_rng(1)
  terminated = rng.random((steps, num_envs)) < 0.15
  truncated = (rng.random((steps, num_envs)) < 0.1) & ~terminated
  reward = rng.normal(size=(steps, num_envs)).astype(np.float32)
  obs = lambda t: np.stack([np.array([e, t], np.float32) for e in range(num_envs)])
  final = lambda t: obs(t) + np.float32(0.5)
  action = lambda t: np.full(num_envs, t % 2, np.int32)
  core = lambda t: rng.normal(size=(num_envs, 4)).astype(np.float32)
  cores = [core(t) for t in range(steps)]

  adder = OverlappingSequenceAdder(num_envs, length, period)
  window = device_replay.sequence_window_init(length, jnp.asarray(obs(0)), jnp.asarray(action(0)),
                                              jnp.asarray(cores[0]))
  add = jax.jit(device_replay.sequence_window_add, static_argnums=8)
  ring = device_replay.ring_init(device_replay.sequence_window_add(window, obs(0), action(0), reward[0],
                                                                    terminated[0], truncated[0], final(0), cores[0],
                                                                    period)[1], slots=3)
  emitted = []
  for t in range(steps):
    expected = adder.add(obs(t), action(t), reward[t], terminated[t], truncated[t], final(t),
                         {START_STATE_KEY: cores[t]})
    window, got, due = add(window, obs(t), action(t), reward[t], terminated[t], truncated[t], final(t), cores[t],
                           period)
    assert bool(due) == (len(expected.reward) > 0), t
    if bool(due):
      for field in expected._fields:
        np.testing.assert_array_equal(np.asarray(getattr(got, field)), getattr(expected, field), err_msg=field)
      emitted.append(expected)
    ring = device_replay.ring_insert(ring, got, due)
  assert len(emitted) == 1 + (steps - length) // period == 10
  written = device_replay.sequences_written(steps, num_envs, length, period)
  assert int(ring.rows) * num_envs == written == 30
  # Three slots: the last three emissions, in FIFO slots (rows 7, 8, 9 -> slots 1, 2, 0); the step
  # after row 9 emitted nothing and left row 7, the next to go, as it was.
  for row in (7, 8, 9):
    np.testing.assert_array_equal(np.asarray(ring.data.observation[row % 3]), emitted[row].observation)


def test_ring_sampling_is_stratified_uniform_and_gathers_locally():
  num_envs, slots = 8, 5
  row = Transition(jnp.zeros((num_envs, 2)), jnp.zeros(num_envs, jnp.int32), jnp.zeros(num_envs),
                   jnp.zeros(num_envs), jnp.zeros((num_envs, 2)))
  ring = device_replay.ring_init(row, slots)
  for t in range(7):  # wraps around: 5 slots, 7 rows
    obs = jnp.stack([jnp.full(num_envs, t, jnp.float32), jnp.arange(num_envs, dtype=jnp.float32)], 1)
    ring = device_replay.ring_insert(ring, row._replace(observation=obs), jnp.asarray(True))
  for batch in (4, 16):
    slot, env = device_replay.sample_indices(jax.random.PRNGKey(1), ring, (200, batch), num_envs)
    first = (np.arange(batch) * num_envs) // batch
    group = max(1, num_envs // batch)
    assert np.all((np.asarray(env) >= first) & (np.asarray(env) < first + group))
    data = device_replay.make_gather(sharding.make_mesh(1), num_envs)(ring.data, slot, env)
    np.testing.assert_array_equal(data.observation[..., 1], env)       # the env column asked for
    assert set(np.unique(data.observation[..., 0])) == {2, 3, 4, 5, 6}  # only the 5 newest rows
  with pytest.raises(Exception, match="num_envs"):
    device_replay.check_sizes(12, 8, 1)


BAD_INPUTS = {
    "unknown gymnax id": (["--env", "gymnax:NoSuchEnv-v0"], "env: unknown gymnax id 'NoSuchEnv-v0'"),
    "gymnasium id": (["--env", "CartPole-v1"], "env: --backend device needs a JAX-native env"),
    "distributed": (["--env", "gymnax:CartPole-v1", "--distributed"], "backend: 'device' is one compiled loop, not a Launchpad program"),
    "factory returns no env": (["--env", "gymnax:examples.jax_envs:not_an_env"],
                               "env: the env factory 'examples.jax_envs:not_an_env' returned str, not a gymnax "
                               "Environment"),
    "factory not importable": (["--env", "gymnax:examples.nowhere:corridor"],
                               "env: cannot import 'examples.nowhere' for the env factory"),
}


@pytest.mark.slow
@pytest.mark.needs_gymnax
def test_bad_input_gives_one_line_and_status_2(tmp_path):
  procs = {name: subprocess.Popen([sys.executable, "-m", "launch.train", "--backend", "device", *args, "--run_dir",
                                   str(tmp_path / name)], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE) for name, (args, _) in BAD_INPUTS.items()}
  for name, proc in procs.items():
    _, err = proc.communicate(timeout=180)
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 2, (name, err)
    assert len(lines) == 1 and "Traceback" not in err, (name, err)
    assert lines[0].startswith("python -m launch.train: error: ") and BAD_INPUTS[name][1] in lines[0], (name, lines)
    assert not (tmp_path / name).exists()


def _read(path):
  with open(path) as f:
    return list(csv.DictReader(f))


@pytest.mark.slow
@pytest.mark.needs_gymnax
def test_an_env_of_your_own_runs_in_the_loop_and_is_learned(tmp_path):
  """`gymnax:pkg.module:function`: the example corridor (goal end drawn at each reset) is solved by
  DQN on the device backend, where always moving one way is not; its threshold is the env's own,
  and the run's policy reloads through the library API."""
  import jrl
  from jrl.run.device.runner import run_device
  from jrl.gymnax_envs import GymnaxVecEnv, reward_threshold
  env_id = "gymnax:examples.jax_envs:corridor"
  env = GymnaxVecEnv(env_id)
  assert env.spec.observation_shape == (2,) and env.spec.num_actions == 2 and env.max_episode_steps == 50
  assert reward_threshold(env_id) == 0.8

  def constant_policy_return(action: int, episodes: int = 256) -> float:
    obs, state = env.reset(jax.random.PRNGKey(0), episodes)
    total, running = jnp.zeros(episodes), jnp.ones(episodes, bool)
    for t in range(env.max_episode_steps):
      out = env.step(jax.random.PRNGKey(t + 1), state, jnp.full(episodes, action, jnp.int32))
      total, state = total + out.reward * running, out.state
      running &= ~(out.terminated | out.truncated)
    return float(total.mean())

  assert max(constant_policy_return(0), constant_policy_return(1)) < 0.4
  run_dir = tmp_path / "corridor"
  exp = ExperimentConfig(agent="dqn", env=env_id, backend="device", seed=0, steps=6_000, eval_every=2_000,
                         eval_episodes=16, run_dir=str(run_dir), progress_seconds=0)
  summary = run_device(exp, dqn.Config(min_replay_size=500))
  assert summary["reward_threshold"] == 0.8
  assert summary["steps_to_threshold"] is not None and summary["eval_return"] >= 0.8, summary
  policy = jrl.load_policy(str(run_dir), "final")
  assert [int(policy(np.asarray([0.0, side], np.float32))) for side in (-1.0, 1.0)] == [0, 1]


@pytest.mark.long  # a learning run; its wiring: R2D2's device digests (bench/digests.py) and its resume test
@pytest.mark.slow
@pytest.mark.needs_gymnax
def test_r2d2_learns_gymnax_cartpole_in_the_loop(tmp_path):
  """R2D2 on the device backend: overlapping sequences with their start core states in a
  prioritized on-device ring, learner calls counted in sequences as the host runner counts them."""
  from jrl.agents import r2d2
  from jrl.run.device.runner import run_device
  from jrl.replay.local import calls_due
  from jrl.replay.on_device import sequences_written
  cfg = r2d2.Config()
  exp = ExperimentConfig(agent="r2d2", env="gymnax:CartPole-v1", backend="device", seed=0, steps=20_000,
                         eval_every=5_000, run_dir=str(tmp_path / "r2d2"), progress_seconds=0)
  summary = run_device(exp, cfg)
  written = sequences_written(20_000 // 8, 8, cfg.sequence_length, cfg.sequence_period)
  u = exp.updates_per_call
  assert summary["learner_steps"] == u * calls_due(written, cfg.replay_spec(), u * cfg.batch_size) > 0
  assert summary["best_eval_return"] >= 200, summary  # a random policy: ~22
  assert summary["details"]["loop_compiles"] == 0


@pytest.mark.slow
@pytest.mark.needs_gymnax
def test_ppo_reaches_475_on_gymnax_cartpole_and_writes_the_run_directory(tmp_path):
  from jrl.run.device.runner import run_device
  import jrl
  run_dir = tmp_path / "run"
  exp = ExperimentConfig(agent="ppo", env="gymnax:CartPole-v1", backend="device", seed=0, steps=100_000,
                         eval_every=2_500, stop_at_threshold=True, run_dir=str(run_dir), progress_seconds=0)
  summary = run_device(exp, ppo.Config())
  assert summary["steps_to_threshold"] is not None and summary["best_eval_return"] >= 475, summary
  assert summary["details"]["loop_compiles"] == 0
  for name in ("config.json", "summary.json", "metrics/actor.csv", "metrics/learner.csv", "metrics/evaluator.csv",
               "plots/learning_curve.png", "policies/best.msgpack", "policies/final.json", "report.md"):
    assert (run_dir / name).is_file(), name
  assert any(name.startswith("events.out.tfevents") for name in os.listdir(run_dir / "tensorboard"))
  saved = json.loads((run_dir / "summary.json").read_text())
  for key in ("params_digest", "eval_return", "steps_to_threshold", "wall_seconds", "rates", "details"):
    assert key in saved, key
  assert saved["kind"] == "device" and saved["details"]["compile_seconds"] > 0
  assert saved["rates"]["env_steps_per_second"] > 0
  best = json.loads((run_dir / "policies" / "best.json").read_text())
  assert set(best) == {"actor_steps", "learner_steps", "eval_return", "eval_index", "eval_seed", "eval_episodes"}
  assert best["eval_return"] >= 475
  assert [r for r in _read(run_dir / "metrics" / "actor.csv")][0].keys() >= {"actor_steps", "episode_return",
                                                                              "steps_per_second"}
  policy = jrl.load_policy(str(run_dir))  # the snapshot reloads through the library API
  assert policy(np.zeros(4, np.float32)) in (0, 1)


def _short_run(tmp_path, name, agent, steps, chunk_steps=None, **exp_fields):
  from jrl.run.device.runner import run_device
  cfg = dqn.Config(min_replay_size=256, epsilon_decay_steps=1_000) if agent == "dqn" else ppo.Config()
  exp = ExperimentConfig(**{"agent": agent, "env": "gymnax:CartPole-v1", "backend": "device", "seed": 3, "steps": steps,
                            "eval_every": 1_024, "eval_episodes": 4, "run_dir": str(tmp_path / name),
                            "progress_seconds": 0, **exp_fields})
  return run_device(exp, cfg, chunk_steps=chunk_steps)


@pytest.mark.slow
@pytest.mark.needs_gymnax
def test_same_seed_same_bytes_and_chunking_does_not_change_training(tmp_path):
  a = _short_run(tmp_path, "a", "dqn", 2_048)
  b = _short_run(tmp_path, "b", "dqn", 2_048)
  c = _short_run(tmp_path, "c", "dqn", 2_048, chunk_steps=512)
  # Samples per insert as the embedded runner: calls due for the transitions written (n-step: n - 1 steps late).
  from jrl.replay.local import calls_due
  cfg = dqn.Config(min_replay_size=256, epsilon_decay_steps=1_000)
  written = (a["actor_steps"] // 8 - (cfg.n_step - 1)) * 8
  assert a["learner_steps"] == 4 * calls_due(written, cfg.replay_spec(), 4 * cfg.batch_size) > 0
  assert a["params_digest"] == b["params_digest"] == c["params_digest"]
  # Metric rows are summed on device in iteration order, whatever the chunks: the same rows.
  untimed = lambda name, role: [{k: v for k, v in row.items()
                                 if k not in ("updates_per_second", "steps_per_second", "wall_seconds")}
                                for row in _read(tmp_path / name / "metrics" / f"{role}.csv")]
  for role in ("learner", "actor", "evaluator"):
    assert untimed("a", role) == untimed("b", role) == untimed("c", role), role


@pytest.mark.slow
@pytest.mark.needs_gymnax
def test_a_run_resumed_from_its_checkpoint_ends_with_the_same_bytes(tmp_path):
  """Killed after its first checkpoint (the later checkpoint and rows removed, as a crash leaves
  them), a DQN run resumed with --resume ends as the uninterrupted run: same parameters, same
  learner and evaluation rows; a finished run extends to more steps the same way."""
  import shutil
  from jrl.errors import ConfigError
  from jrl.experiment import resume
  from jrl.experiment.checkpoint import Checkpointer
  from jrl.run.device.runner import run_device
  whole = _short_run(tmp_path, "whole", "dqn", 3_072, chunk_steps=512)
  crashed = _short_run(tmp_path, "crashed", "dqn", 3_072, chunk_steps=512, checkpoint_every_steps=1_024)
  assert crashed["params_digest"] == whole["params_digest"]
  assert crashed["checkpoints"] == ["ckpt-000001", "ckpt-000002", "ckpt-000003"]
  run_dir = tmp_path / "crashed"
  for name in ("ckpt-000002", "ckpt-000003"):  # the crash came after the first checkpoint (1,024 steps)
    shutil.rmtree(run_dir / "checkpoints" / name)
  assert Checkpointer(str(run_dir)).latest().manifest["counters"]["actor_steps"] == 1_024
  exp, agent_cfg = resume.resumed_configs(str(run_dir), {"steps": 3_072}, {})
  resumed = run_device(exp, agent_cfg, chunk_steps=512)
  assert resumed["resumed"] and resumed["actor_steps"] == 3_072
  assert resumed["params_digest"] == whole["params_digest"]
  assert resumed["learner_steps"] == whole["learner_steps"] and resumed["episodes"] == whole["episodes"]
  untimed = lambda name, role: [{k: v for k, v in row.items() if k not in ("updates_per_second", "wall_seconds",
                                                                            "steps_per_second")}
                                for row in _read(tmp_path / name / "metrics" / f"{role}.csv")]
  for role in ("actor", "learner", "evaluator"):
    assert untimed("crashed", role) == untimed("whole", role), role
  # A finished run extends: 3,072 more steps from its final checkpoint, as one run of 4,096.
  longer = _short_run(tmp_path, "longer", "dqn", 4_096, chunk_steps=512)
  exp, agent_cfg = resume.resumed_configs(str(run_dir), {"steps": 4_096}, {})
  extended = run_device(exp, agent_cfg, chunk_steps=512)
  assert extended["params_digest"] == longer["params_digest"]
  with pytest.raises(ConfigError, match="^steps: the run already has 4096 env steps"):
    run_device(resume.resumed_configs(str(run_dir), {"steps": 4_096}, {})[0], agent_cfg, chunk_steps=512)
  # A checkpoint of another loop (here: other envs) is refused, naming what does not fit.
  other = resume.resumed_configs(str(run_dir), {"steps": 8_192}, {})[0]
  other = dataclasses.replace(other, num_envs=16)
  with pytest.raises(ConfigError, match="^resume: .*loop array"):
    run_device(other, agent_cfg, chunk_steps=512)


@pytest.mark.needs_gymnax
def test_launch_evaluate_repeats_a_device_runs_evaluation(tmp_path, capsys):
  """launch.evaluate on a device run plays the snapshot's own evaluation again, on device: the
  same mean return the run recorded; a video is refused in one line (gymnax envs do not render)."""
  from launch import evaluate
  summary = _short_run(tmp_path, "run", "dqn", 2_048)
  run_dir = str(tmp_path / "run")
  # The run report, as every kind of run writes one: the compiled loop, evaluation and compilation
  # are the host thread's phases, and they add up to the run's wall time.
  report_text = (tmp_path / "run" / "report.md").read_text()
  phases = summary["phase_seconds"]["main"]
  assert set(phases) == {"device_loop", "eval", "compile", "other"}, phases
  assert abs(sum(phases.values()) - summary["wall_seconds"]) <= 0.01 * summary["wall_seconds"], summary
  assert phases["device_loop"] > 0 and phases["compile"] > 0
  assert summary["bottleneck"] in ("device loop", "evaluation", "other")
  assert f"**bottleneck: {summary['bottleneck']}**" in report_text and summary["bottleneck_advice"] in report_text
  for which in ("best", "final"):
    recorded = json.loads((tmp_path / "run" / "policies" / f"{which}.json").read_text())
    capsys.readouterr()
    assert evaluate.main([run_dir, "--which", which]) == 0
    out = capsys.readouterr().out
    assert f"return {recorded['eval_return']:.3f} ± " in out, (which, recorded, out)
    assert f"over {recorded['eval_episodes']} episodes" in out
  with pytest.raises(SystemExit) as exited:
    evaluate.main([run_dir, "--video", str(tmp_path / "v.mp4")])
  assert exited.value.code == 2
  assert "video: the run's gymnax env (gymnax:CartPole-v1) does not render" in capsys.readouterr().err


TWO_DEVICES = """
import json, sys
import distrax, rlax
import jax, numpy as np
from jrl.agents import dqn, ppo, r2d2
from jrl.run.device.runner import run_device
from jrl.experiment.config import ExperimentConfig
from jrl.experiment.snapshots import load_params
out = {}
configs = {"dqn": dqn.Config(min_replay_size=512), "ppo": ppo.Config(), "r2d2": r2d2.Config(min_replay_size=64)}
for agent, steps in (("ppo", 3072), ("dqn", 640), ("r2d2", 3000)):
  for devices in (1, 2):
    cfg = configs[agent]
    run_dir = f"{sys.argv[1]}/{agent}{devices}"
    exp = ExperimentConfig(agent=agent, env="gymnax:CartPole-v1", backend="device", seed=1, steps=steps,
                           eval_every=1024, learner_devices=devices, run_dir=run_dir, progress_seconds=0)
    s = run_device(exp, cfg)
    params = [np.asarray(x).tolist() for x in jax.tree_util.tree_leaves(load_params(run_dir, "final"))]
    out[f"{agent}{devices}"] = {"summary": s, "params": params}
json.dump({"devices": jax.device_count(), **out}, open(sys.argv[1] + "/out.json", "w"))
"""


@pytest.mark.slow
@pytest.mark.needs_gymnax
def test_two_devices_learn_as_one(tmp_path):
  """Forced 2 CPU devices: the same eval curve (PPO) and the same parameters within float
  tolerance (DQN and R2D2, whose gradient all-reduce sums in another order), each with no compile
  in the loop."""
  script = tmp_path / "two.py"
  script.write_text(TWO_DEVICES)
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", PYTHONPATH=ROOT)
  proc = subprocess.run([sys.executable, str(script), str(tmp_path)], cwd=ROOT, env=env, text=True,
                        capture_output=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads((tmp_path / "out.json").read_text())
  assert out["devices"] == 2
  for agent in ("ppo", "dqn", "r2d2"):
    one, two = out[f"{agent}1"], out[f"{agent}2"]
    assert (one["summary"]["learner_devices"], two["summary"]["learner_devices"]) == (1, 2)
    assert one["summary"]["details"]["loop_compiles"] == two["summary"]["details"]["loop_compiles"] == 0
    assert one["summary"]["learner_steps"] == two["summary"]["learner_steps"] > 0
    if agent == "ppo":
      # Calls of 8 epochs x 4 minibatches: the reduction order's last-bit differences grow over that
      # many updates, by how much depends on the CPU, so PPO is held to its eval curve over its first
      # 3072 steps, below; the short DQN and R2D2 runs to their parameters.
      continue
    for x, y in zip(one["params"], two["params"]):
      np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=1e-3, atol=1e-4)
  curves = [[float(r["eval_return"]) for r in _read(tmp_path / f"ppo{d}" / "metrics" / "evaluator.csv")]
            for d in (1, 2)]
  np.testing.assert_allclose(curves[1], curves[0], rtol=1e-5)


def test_prioritized_sampling_follows_priorities_and_updates_them():
  num_envs, slots = 4, 3
  row = Transition(jnp.zeros((num_envs, 1)), jnp.zeros(num_envs, jnp.int32), jnp.zeros(num_envs),
                   jnp.zeros(num_envs), jnp.zeros((num_envs, 1)))
  ring = device_replay.ring_init(row, slots, prioritized=True)
  for _ in range(2):  # 2 of 3 slots filled
    ring = device_replay.ring_insert(ring, row, jnp.asarray(True))
  assert np.all(np.asarray(ring.priority[:2]) == device_replay.INITIAL_PRIORITY)
  priority = np.zeros((slots, num_envs), np.float32)
  priority[0] = [1, 2, 3, 4]
  priority[1] = [0, 0, 0, 10]
  priority[2] = 100  # an unfilled slot: never drawn
  ring = ring._replace(priority=jnp.asarray(priority))
  slot, env, weights = device_replay.sample_prioritized(jax.random.PRNGKey(0), ring, (50, 400), 1.0, 0.5)
  slot, env, weights = map(np.asarray, (slot, env, weights))
  assert slot.max() <= 1 and not np.any((slot == 1) & (env < 3))
  freq = np.bincount(slot.reshape(-1) * num_envs + env.reshape(-1), minlength=8)[:8] / slot.size
  np.testing.assert_allclose(freq, priority[:2].reshape(-1) / 20.0, atol=0.01)
  expected = (8 * priority[slot, env] / 20.0) ** -0.5
  np.testing.assert_allclose(weights, expected / expected.max(axis=1, keepdims=True), rtol=1e-5)
  updated = device_replay.update_priorities(ring, jnp.asarray([[0, 0]]), jnp.asarray([[1, 1]]),
                                            jnp.asarray([[0.5, 0.25]]))
  assert float(updated.priority[0, 1]) == 0.5 and float(updated.priority[0, 0]) == 1.0


@pytest.mark.slow
@pytest.mark.needs_gymnax
def test_evaluations_inside_one_chunk_keep_the_best_parameters_and_stop_at_the_threshold(tmp_path, capsys):
  """Eight evaluations in one compiled chunk (every 256 steps of 2,048): the best policy saved is
  the parameters of the best of them (launch.evaluate plays its return again), the final one the
  last's, also where the best is inside the chunk and not its last; with --stop_at_threshold the
  run ends at the first evaluation at or above the threshold, though the chunk had iterations left."""
  from launch import evaluate
  summary = _short_run(tmp_path, "run", "dqn", 2_048, chunk_steps=2_048, eval_every=256)
  rows = _read(tmp_path / "run" / "metrics" / "evaluator.csv")
  returns = [float(r["eval_return"]) for r in rows]
  assert [int(r["actor_steps"]) for r in rows] == list(range(256, 2_049, 256))
  assert summary["details"]["device_evaluations"] == 8 and summary["evaluations"] == 8
  best = json.loads((tmp_path / "run" / "policies" / "best.json").read_text())
  assert best["eval_return"] == max(returns) and best["eval_index"] == returns.index(max(returns)), (best, returns)
  # A best inside the chunk, not its last: the same run cut in one chunk just after a fall from a
  # new best. Which evaluation falls is the CPU's floats' to say (the bytes differ between CPUs),
  # so the cut is read off this machine's returns.
  cut = next((i for i in range(1, len(returns)) if returns[i] < returns[i - 1] == max(returns[:i])), None)
  assert cut is not None, f"no evaluation fell below a new best: {returns}"
  cut_steps = 256 * (cut + 1)
  _short_run(tmp_path, "cut", "dqn", cut_steps, chunk_steps=cut_steps, eval_every=256)
  assert [float(r["eval_return"]) for r in _read(tmp_path / "cut" / "metrics" / "evaluator.csv")] == \
      returns[:cut + 1]
  cut_best = json.loads((tmp_path / "cut" / "policies" / "best.json").read_text())
  assert cut_best["eval_index"] == cut - 1 and cut_best["eval_return"] == returns[cut - 1] > returns[cut], cut_best
  for run, which in (("cut", "best"), ("cut", "final"), ("run", "best"), ("run", "final")):
    recorded = json.loads((tmp_path / run / "policies" / f"{which}.json").read_text())
    capsys.readouterr()
    assert evaluate.main([str(tmp_path / run), "--which", which]) == 0
    assert f"return {recorded['eval_return']:.3f} ± " in capsys.readouterr().out, (run, which)
  # The threshold: the first evaluation reaching it ends the run, mid-chunk.
  threshold = sorted(set(returns))[-2]  # reached before the last evaluation
  first = next(i for i, r in enumerate(returns) if r >= threshold)
  stopped = _short_run(tmp_path, "stopped", "dqn", 2_048, chunk_steps=2_048, eval_every=256, stop_at_threshold=True,
                       reward_threshold=threshold)
  assert stopped["actor_steps"] == stopped["steps_to_threshold"] == 256 * (first + 1) < 2_048, (stopped, returns)
  assert [float(r["eval_return"]) for r in _read(tmp_path / "stopped" / "metrics" / "evaluator.csv")] == \
      returns[:first + 1]


BEFORE_IN_LOOP_EVALUATION = "18d3c4a"  # the last commit whose device runs evaluated between chunks, on the host


@pytest.mark.slow
@pytest.mark.needs_gymnax
def test_a_device_checkpoint_written_before_evaluation_moved_into_the_loop_resumes(tmp_path):
  """A device DQN run written by the code before evaluations moved into the compiled chunk (from
  git, run here), stopped at 1,024 steps and resumed by today's code to 3,072, ends with the bytes
  of today's run never stopped, and the same evaluations."""
  code = tmp_path / "writer"
  code.mkdir()
  archive = subprocess.run(["git", "-C", ROOT, "archive", BEFORE_IN_LOOP_EVALUATION, "jrl", "launch"],
                           capture_output=True)
  if archive.returncode != 0:
    pytest.skip(f"commit {BEFORE_IN_LOOP_EVALUATION} is not in this checkout's git history")
  subprocess.run(["tar", "-x", "-C", str(code)], input=archive.stdout, check=True)
  flags = ["--agent", "dqn", "--env", "gymnax:CartPole-v1", "--backend", "device", "--seed", "3", "--eval_every",
           "1024", "--eval_episodes", "4", "--min_replay_size", "256", "--epsilon_decay_steps", "1000",
           "--progress_seconds", "0"]
  old = subprocess.run([sys.executable, "-m", "launch.train", *flags, "--steps", "1024",
                        "--run_dir", str(tmp_path / "old")], cwd=code, capture_output=True, text=True, timeout=600)
  assert old.returncode == 0, old.stderr[-3000:]
  resumed = subprocess.run([sys.executable, "-m", "launch.train", "--resume", str(tmp_path / "old"), "--steps", "3072",
                            "--progress_seconds", "0"], cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  whole = _short_run(tmp_path, "whole", "dqn", 3_072)
  with open(tmp_path / "old" / "summary.json") as f:
    after = json.load(f)
  assert after["resumed"] and after["actor_steps"] == 3_072
  assert after["params_digest"] == whole["params_digest"]
  evals = lambda name: [(r["actor_steps"], r["learner_steps"], r["eval_return"])
                        for r in _read(tmp_path / name / "metrics" / "evaluator.csv")]
  assert evals("old") == evals("whole") and len(evals("whole")) == 3


@pytest.mark.slow
@pytest.mark.needs_gymnax
def test_an_identical_second_command_loads_the_compiled_loop_from_the_cache(tmp_path):
  """The chunk (its evaluations in it) and the run's other programs go into JAX's persistent
  cache: the same command again compiles none of them, it loads every one; both reports give
  their compile seconds."""
  env = {**os.environ, "JRL_JAX_CACHE": str(tmp_path / "cache")}
  details = []
  for name in ("first", "second"):
    done = subprocess.run([sys.executable, "-m", "launch.train", "--agent", "ppo", "--env", "gymnax:CartPole-v1",
                           "--backend", "device", "--steps", "8192", "--progress_seconds", "0",
                           "--run_dir", str(tmp_path / name)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(tmp_path / name / "summary.json") as f:
      summary = json.load(f)
    details.append(summary["details"])
    assert summary["phase_seconds"]["main"]["compile"] == pytest.approx(summary["details"]["compile_seconds"], abs=1e-3)
    assert "| compile |" in (tmp_path / name / "report.md").read_text()
  first, second = details
  assert first["compilation_cache_hits"] == 0 and first["backend_compiles"] > 0, first
  assert second["compilation_cache_hits"] == second["backend_compiles"] == first["backend_compiles"], second


def test_compiled_meanwhile_hands_over_the_program_or_its_error():
  """`CompiledMeanwhile` runs the compile on a thread of its own and hands the host thread its
  program, or the error the compile raised; as a context it waits for the compile however the
  block ends (an error of the block's own is raised, not the compile's)."""
  import threading
  from jrl.run.device.runner import CompiledMeanwhile
  threads = []
  compiled = CompiledMeanwhile(lambda: threads.append(threading.current_thread().name) or "program")
  assert compiled.result() == "program" and threads == ["jrl-compile"]

  def failing():
    raise ValueError("XLA refused it")
  with pytest.raises(ValueError, match="^XLA refused it$"):
    CompiledMeanwhile(failing).result()
  release, finished = threading.Event(), []

  def slow():
    release.wait()
    finished.append(True)
  with pytest.raises(KeyError):
    with CompiledMeanwhile(slow):
      release.set()
      raise KeyError("the init failed")
  assert finished == [True]  # the compile was waited for before the block's error went on


@pytest.mark.needs_gymnax
def test_a_device_run_compiles_its_chunk_beside_the_init(tmp_path, monkeypatch):
  """The set-up's two large programs compile on two threads: the chunk on `jrl-compile`, the
  loop's init on the host thread, which runs the init while the chunk compiles; the loop then
  compiles nothing. (An empty compilation cache of its own: a program loaded from the cache is
  not compiled.)"""
  import threading
  monkeypatch.setenv("JRL_JAX_CACHE", str(tmp_path / "jax-cache"))
  compiles, recording = [], [True]

  def listen(event, duration, **kwargs):
    if recording[0] and event == "/jax/core/compile/backend_compile_duration":
      compiles.append((kwargs.get("fun_name"), threading.current_thread().name))
  jax.monitoring.register_event_duration_secs_listener(listen)
  try:
    summary = _short_run(tmp_path, "run", "ppo", 1_024)
  finally:
    recording[0] = False
  assert ("jit(chunk)", "jrl-compile") in compiles, compiles
  assert ("jit(init)", "MainThread") in compiles, compiles
  assert summary["details"]["loop_compiles"] == 0


@pytest.mark.slow  # four processes, each compiling a device run's programs: a benchmark's run (make test-long)
@pytest.mark.long
@pytest.mark.needs_gymnax
def test_the_overlapped_compile_bench_runs_its_arms(tmp_path):
  """bench/overlapped_compile.py, small: both kinds of run, both ways of compiling, one repeat."""
  out = tmp_path / "overlapped.json"
  done = subprocess.run([sys.executable, "bench/overlapped_compile.py", "--repeats", "1", "--seeds", "2",
                         "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
  record = json.loads(out.read_text())
  assert set(record["arms"]) == {"single run", "sweep of 2"}
  for row in record["arms"].values():
    assert row["setup_seconds_serial"] > 0 and row["setup_seconds_overlapped"] > 0, row
    assert row["setup_ratio"] == round(row["setup_seconds_overlapped"] / row["setup_seconds_serial"], 2), row
