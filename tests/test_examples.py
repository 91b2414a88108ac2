"""Each example in examples/ runs, with a short budget, and does what it claims."""

import json
import os
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

import jrl
from examples import custom_loss, custom_torso, own_loop
from jrl import dqn
from jrl.experiment import snapshots
from jrl.learners.learner import make_multi_update, params_digest
from jrl.replay.local import LocalReplay

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_own_loop_with_a_custom_torso_reaches_475_within_50k_steps():
  start = time.perf_counter()
  result = own_loop.train(seed=0, steps=50_000, verbose=False)
  assert result.steps_to_threshold is not None and result.steps_to_threshold <= 50_000, result.evaluations
  assert result.evaluations[-1][1] >= 475.0
  # LocalReplay's schedule: one update per env step once min_replay_size (1000) are in replay,
  # taken 8 at a time, less what the adder and block writer still hold.
  assert result.env_steps - 1000 - 30 <= result.updates <= result.env_steps - 1000 + 1
  print(f"custom torso: threshold at {result.steps_to_threshold} env steps, {result.seconds:.1f}s "
        f"(test {time.perf_counter() - start:.1f}s)")


def test_custom_torso_is_the_old_name_of_own_loop():
  assert (custom_torso.train, custom_torso.QHead, custom_torso.main) == (own_loop.train, own_loop.QHead, own_loop.main)


def _dqn_setup(seed=0):
  cfg = dqn.Config(batch_size=32, min_replay_size=64)
  env = jrl.make_vector_env("CartPole-v1", 4, seed)
  replay = LocalReplay.for_agent(cfg, 4, seed, env=env)
  obs, _ = env.reset(seed=seed)
  while replay.updates_due() < 10:
    action = env.action_space.sample()
    next_obs, reward, terminated, truncated, info = env.step(action)
    replay.add(obs, action, reward, terminated, truncated, next_obs, info)
    obs = next_obs
  return cfg, dqn.make_networks(jrl.env_spec(env), cfg), replay.sample(10)


def _params_after(learner, batches):
  state = jax.jit(learner.init)(jax.random.PRNGKey(0))
  state, _ = jax.jit(make_multi_update(learner.update))(state, batches)
  return learner.params(state)


def test_custom_loss_is_the_only_difference_from_the_stock_learner():
  cfg, networks, batches = _dqn_setup()
  stock = params_digest(_params_after(dqn.make_learner(networks, cfg), batches))
  assert params_digest(_params_after(dqn.make_learner(networks, cfg, loss=dqn.loss), batches)) == stock
  custom = _params_after(dqn.make_learner(networks, cfg, loss=custom_loss.make_loss(1e-3)), batches)
  assert params_digest(custom) != stock

  # The custom loss against numpy: mean(w * td^2) + wd * sum(p^2).
  batch = jax.tree_util.tree_map(lambda x: x[0], batches)
  params = networks.init(jax.random.PRNGKey(1))
  target = networks.init(jax.random.PRNGKey(2))
  value, td = custom_loss.mse_weight_decay_loss(networks, params, target, batch, cfg, weight_decay=1e-3)
  t = batch.transitions
  q = np.asarray(networks.apply(params, t.observation))
  q_next_online = np.asarray(networks.apply(params, t.next_observation))
  q_next_target = np.asarray(networks.apply(target, t.next_observation))
  best = q_next_online.argmax(axis=1)
  rows = np.arange(len(best))
  expected_td = t.reward + t.discount * q_next_target[rows, best] - q[rows, t.action]
  np.testing.assert_allclose(td, expected_td, rtol=1e-5, atol=1e-5)
  l2 = sum(float(np.sum(np.square(p))) for p in jax.tree_util.tree_leaves(params))
  np.testing.assert_allclose(value, np.mean(batch.weights * expected_td ** 2) + 1e-3 * l2, rtol=1e-5)


def test_custom_loss_learns_cartpole_in_an_own_loop():
  result = own_loop.train(seed=0, steps=2_504, module=None, loss=custom_loss.make_loss(1e-4), verbose=False)
  assert len(result.evaluations) == 1
  assert result.evaluations[0][1] > 100.0  # a random policy averages ~20


def _train_cli(module, args, timeout):
  return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, text=True, capture_output=True,
                        timeout=timeout)


@pytest.mark.slow
def test_custom_agent_and_env_factory_through_the_command_line(tmp_path):
  run_dir = tmp_path / "run"
  out = _train_cli("examples.my_agent", ["--env", "examples.envs:masked_cartpole", "--deterministic", "--steps", "2000",
                                         "--min_replay_size", "500", "--eval_every", "1000", "--eval_episodes", "3",
                                         "--weight_decay", "0.001", "--progress_seconds", "0",
                                         "--run_dir", str(run_dir)], timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  summary = json.loads((run_dir / "summary.json").read_text())
  config = json.loads((run_dir / "config.json").read_text())
  assert (summary["agent"], summary["env"]) == ("examples.my_agent", "examples.envs:masked_cartpole")
  assert summary["actor_steps"] == 2000 and summary["evaluations"] == 2 and summary["learner_steps"] > 0
  assert summary["reward_threshold"] == 475.0  # the factory's env keeps CartPole-v1's spec
  assert config["agent"]["weight_decay"] == 0.001
  # The snapshot rebuilds the custom agent (LayerNorm torso) on the factory's env (2 observations).
  params = snapshots.load_params(str(run_dir), "final")
  assert "LayerNorm_0" in params["params"]["LayerNormTorso_0"]
  policy = jrl.load_policy(str(run_dir), "final")
  actions = policy(np.zeros((5, 2), np.float32))
  assert actions.shape == (5,) and set(np.unique(actions)) <= {0, 1}
  # A video of the factory's env: frames rendered through the factory (render_mode passed on).
  video = tmp_path / "masked.mp4"
  out = subprocess.run([sys.executable, "-m", "launch.evaluate", str(run_dir), "--episodes", "1", "--video", str(video)],
                       cwd=ROOT, text=True, capture_output=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert video.read_bytes()[4:8] == b"ftyp" and "frames 600x400" in out.stdout, out.stdout


def test_default_run_dirs_of_module_references_are_path_safe():
  from jrl.experiment.config import ExperimentConfig
  name = ExperimentConfig(agent="examples.my_agent", env="examples.envs:masked_cartpole", seed=3).default_run_dir()
  assert name.startswith("runs/examples.my_agent-examples.envs_masked_cartpole-s3-") and ":" not in name
  assert ExperimentConfig(env="gymnax:CartPole-v1").default_run_dir().startswith("runs/dqn-gymnax_CartPole-v1-s0-")


@pytest.mark.slow
@pytest.mark.needs_reverb
def test_custom_agent_and_env_factory_distributed(tmp_path):
  run_dir = tmp_path / "run"
  out = _train_cli("examples.envs", ["--agent", "examples.my_agent", "--distributed", "--num_actors", "1",
                                     "--steps", "1500", "--min_replay_size", "500", "--eval_every", "1000",
                                     "--eval_episodes", "2", "--max_restarts", "0", "--run_dir", str(run_dir)],
                   timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  summary = json.loads((run_dir / "summary.json").read_text())
  assert (summary["agent"], summary["env"], summary["kind"]) == ("examples.my_agent",
                                                                 "examples.envs:masked_cartpole", "distributed")
  assert summary["actor_steps"] >= 1500 and summary["learner_steps"] > 0 and summary["evaluations"] >= 1


@pytest.mark.slow
def test_seed_sweep_example_compares_two_agents_in_one_report(tmp_path, monkeypatch, capsys):
  """Into its own folder by default: it wrote runs/compare, where the sweeps page has a user's
  `launch.report` write, and replaced a user's comparison."""
  from examples import seed_sweep
  monkeypatch.chdir(tmp_path)  # its folders are relative, as a user's are: tmp_path stands for the repository
  (tmp_path / "runs" / "compare").mkdir(parents=True)
  (tmp_path / "runs" / "compare" / "report.md").write_text("a user's comparison")
  status = seed_sweep.main(["--seeds", "0-1", "--parallel", "2", "--steps", "1600", "--deterministic",
                            "--eval_every", "800", "--eval_episodes", "2", "--progress_seconds", "0"])
  assert status == 0
  out = tmp_path / "runs" / "examples" / "seed_sweep"
  report = json.load(open(out / "report.json"))
  groups = {(g["agent"], g["env"]): len(g["scores"]) for g in report["groups"]}
  assert groups == {("dqn", "CartPole-v1"): 2, ("ppo", "CartPole-v1"): 2}, groups
  assert (out / "report.md").is_file() and sorted(os.listdir(tmp_path / "runs")) == ["compare", "examples"]
  assert os.listdir(tmp_path / "runs" / "compare") == ["report.md"]
  assert (tmp_path / "runs" / "compare" / "report.md").read_text() == "a user's comparison"
  printed = capsys.readouterr().out.splitlines()
  assert printed[0] == "seed_sweep: dqn,ppo on CartPole-v1, seeds 0-1, into runs/examples/seed_sweep/", printed[:3]
  assert printed[-1].endswith("| runs/examples/seed_sweep/report.md"), printed[-3:]


@pytest.mark.slow
@pytest.mark.needs_gymnax
def test_device_run_example_writes_a_run_directory(tmp_path):
  out = subprocess.run([sys.executable, "-m", "examples.device_run", "--steps", "8192", "--run_dir",
                        str(tmp_path / "device")], cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  summary = json.load(open(tmp_path / "device" / "summary.json"))
  assert summary["kind"] == "device" and summary["actor_steps"] >= 8192
  assert out.stdout.strip().splitlines()[-1].startswith("ppo on gymnax:CartPole-v1: best eval ")


@pytest.mark.slow
@pytest.mark.needs_reverb
def test_launch_script_adds_its_own_node_to_the_program(tmp_path):
  """examples/launch_script.py: jrl's program from make_program, a node of the script's own (a noisy
  evaluator) added, launched by launch_program: the run finishes and the extra node wrote its rows."""
  run_dir = tmp_path / "script"
  out = subprocess.run([sys.executable, "-m", "examples.launch_script", "--steps", "4000", "--run_dir", str(run_dir)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  assert "os.fork()" not in out.stderr, out.stderr[-3000:]  # make_program starts no JAX backend before the nodes fork
  summary = json.load(open(run_dir / "summary.json"))
  assert summary["kind"] == "distributed" and summary["actor_steps"] >= 4000
  import csv
  rows = list(csv.DictReader(open(run_dir / "metrics" / "noisy_evaluator.csv")))
  assert rows and set(rows[0]) >= {"actor_steps", "learner_version", "noisy_eval_return"}, rows[:1]
  assert all(0 < float(row["noisy_eval_return"]) <= 500 for row in rows)
  assert out.stdout.strip().splitlines()[-1].startswith("eval ")
