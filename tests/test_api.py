"""The public API: `import jrl` names, agent modules' pluggable networks, losses and optimisers,
LocalReplay, env factories, and no import side effects."""

import dataclasses
import os
import subprocess
import sys

import flax.linen as nn
import gymnasium as gym
import jax
import numpy as np
import optax
import pytest

import jrl
from examples.envs import masked_cartpole
from jrl import dqn, impala, ppo, pqn, r2d2, sac, td3
from jrl.envs import final_observations, make_vector_env
from jrl.errors import ConfigError
from jrl.learners.learner import make_multi_update, params_digest
from jrl.networks import QNetwork
from jrl.replay.adders import make_block_writer
from jrl.replay.batches import make_assembler
from jrl.replay.buffer import SeededReplayBuffer
from jrl.replay.local import LocalReplay, calls_due
from jrl.replay.sequence_adder import START_STATE_KEY
from jrl.replay.spec import ReplaySpec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIECES = ("Config", "Networks", "TrainingState", "make_networks", "make_learner", "make_policy", "make_replay_spec",
          "loss")


def test_import_jrl_is_light_and_every_public_name_resolves():
  code = ("import sys, jrl; light = 'jax' not in sys.modules and 'matplotlib' not in sys.modules; "
          "[getattr(jrl, n) for n in jrl.__all__]; "
          "print(light, 'tensorflow' in sys.modules and sys.modules['tensorflow'] is not None, "
          "'matplotlib.pyplot' in sys.modules)")
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
  assert out.stdout.split() == ["True", "False", "False"]
  for name in ("dqn", "ppo", "impala", "sac", "LocalReplay", "Evaluator", "Learner", "make_vector_env",
               "Trajectory", "LearnerBatch", "ReplaySpec", "load_policy"):
    assert name in jrl.__all__ and name in dir(jrl)
  assert jrl.LocalReplay is LocalReplay and jrl.dqn is dqn
  # The names the replay package itself offers (jrl.replay.LocalReplay, as in the README).
  assert jrl.replay.LocalReplay is LocalReplay and jrl.replay.calls_due is jrl.calls_due
  assert jrl.replay.ReplaySpec is jrl.ReplaySpec and sorted(jrl.replay.__all__) == jrl.replay.__all__
  assert os.path.exists(os.path.join(ROOT, "jrl", "py.typed"))


def test_agent_modules_import_by_their_short_name_from_a_users_module(tmp_path):
  """`from jrl.dqn import Config, make_networks` in a user's file, as the docs write it: the import
  statement does not consult `jrl.__getattr__`, so this failed with ModuleNotFoundError while
  `jrl.dqn.Config` worked. Each name is the same module as jrl.agents.<name> (no second copy of
  a class), a submodule too, and `import jrl` alone still loads no JAX."""
  from jrl.registry import AGENTS
  for name in AGENTS:
    (tmp_path / f"user_{name}.py").write_text(f"from jrl.{name} import Config, make_networks\n"
                                              f"import jrl.{name}.config\n")
  (tmp_path / "main.py").write_text(
      "import importlib, sys\n"
      "import jrl\n"
      "print('light', 'jax' not in sys.modules)\n"
      f"for name in {sorted(AGENTS)!r}:\n"
      "  user = importlib.import_module(f'user_{name}')\n"
      "  real = importlib.import_module(f'jrl.agents.{name}')\n"
      "  print(name, user.Config is real.Config, user.make_networks is real.make_networks,\n"
      "        sys.modules[f'jrl.{name}'] is real, getattr(jrl, name) is real, real.__spec__.name == real.__name__,\n"
      "        sys.modules[f'jrl.{name}.config'] is sys.modules[f'jrl.agents.{name}.config'])\n")
  out = subprocess.run([sys.executable, str(tmp_path / "main.py")], cwd=tmp_path, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=ROOT))
  assert out.returncode == 0, out.stderr[-3000:]
  lines = out.stdout.splitlines()
  assert lines[0] == "light True"
  assert lines[1:] == [f"{name} True True True True True True" for name in sorted(AGENTS)]


@pytest.mark.parametrize("agent", [dqn, ppo, pqn, impala, sac, r2d2, td3])
def test_agent_modules_export_the_pieces(agent):
  for piece in PIECES:
    assert hasattr(agent, piece) and piece in agent.__all__, piece


def test_importing_the_runner_and_plotting_leave_matplotlib_backend_alone(tmp_path):
  code = f"""
import matplotlib
matplotlib.use("svg")
import jrl.run.embedded
from jrl.experiment import plots
import os
os.makedirs({str(tmp_path)!r} + "/metrics")
with open({str(tmp_path)!r} + "/metrics/evaluator.csv", "w") as f:
  f.write("actor_steps,eval_return\\n1,2\\n3,4\\n")
path = plots.plot_learning_curve({str(tmp_path)!r}, "t", 3.0)
import sys
print(matplotlib.get_backend(), "matplotlib.pyplot" in sys.modules, open(path, "rb").read(4) == b"\\x89PNG")
"""
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
  assert out.stdout.split() == ["svg", "False", "True"]


# --- Learners: the default loss passed explicitly, custom modules and optimisers -------------------

def _random_steps(replay: LocalReplay, env_id: str, num_envs: int, vector_steps: int, extras_fn=None, seed=0):
  env = make_vector_env(env_id, num_envs, seed)
  obs, _ = env.reset(seed=seed)
  for _ in range(vector_steps):
    action = env.action_space.sample()
    next_obs, reward, terminated, truncated, info = env.step(action)
    replay.add(obs, action, reward, terminated, truncated, next_obs, info,
               extras=extras_fn(action) if extras_fn else None)
    obs = next_obs
  env.close()


def _uniform_behaviour(num_actions):
  # A uniform random behaviour policy: its log-prob and logits.
  return lambda a: {"log_prob": np.full(a.shape, -np.log(num_actions), np.float32),
                    "logits": np.zeros(a.shape + (num_actions,), np.float32)}


AGENT_CASES = {
    "dqn": (dqn, dqn.Config(batch_size=32, min_replay_size=64, block_size=4), "CartPole-v1", 20),
    "sac": (sac, sac.Config(batch_size=32, min_replay_size=64, hidden_sizes=(16, 16)), "Pendulum-v1", 20),
    "td3": (td3, td3.Config(batch_size=32, min_replay_size=64, hidden_sizes=(16, 16)), "Pendulum-v1", 20),
    "ppo": (ppo, ppo.Config(batch_size=4, sequence_length=16, num_minibatches=2, num_epochs=1, hidden_sizes=(16,)),
            "CartPole-v1", 32),
    "impala": (impala, impala.Config(batch_size=4, sequence_length=16, hidden_sizes=(16,)), "CartPole-v1", 32),
    "pqn": (pqn, pqn.Config(batch_size=4, sequence_length=16, num_minibatches=2, num_epochs=1, hidden_sizes=(16,)),
            "CartPole-v1", 32),
    "r2d2": (r2d2, r2d2.Config(batch_size=4, sequence_length=8, sequence_period=4, burn_in=2, min_replay_size=8,
                               lstm_size=16, hidden_sizes=(16,)), "CartPole-v1", 24),
}
R2D2_CORE = 2 * AGENT_CASES["r2d2"][1].lstm_size


def _extras_fn(name):
  if name in ("ppo", "impala"):
    return _uniform_behaviour(2)
  if name == "r2d2":  # a recurrent policy reports the core state each step started from
    return lambda a: {START_STATE_KEY: np.full((len(a), R2D2_CORE), 0.5, np.float32)}
  return None


def _batches(name, updates):
  agent, cfg, env_id, vector_steps = AGENT_CASES[name]
  replay = LocalReplay.for_agent(cfg, num_envs=8, seed=3)
  _random_steps(replay, env_id, 8, vector_steps, _extras_fn(name))
  assert replay.updates_due() >= updates
  return agent, cfg, env_id, replay.sample(updates)


def _train(learner, batches):
  state = jax.jit(learner.init)(jax.random.PRNGKey(1))
  state, _ = jax.jit(make_multi_update(learner.update))(state, batches)
  return params_digest(learner.params(state)), state


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(AGENT_CASES))
def test_default_loss_passed_explicitly_gives_the_same_bytes(name):
  agent, cfg = AGENT_CASES[name][:2]
  updates = 1 if agent.make_replay_spec(cfg).kind.sampled_once else 3  # a queue's calls take one batch each
  agent, cfg, env_id, batches = _batches(name, updates)
  env = make_vector_env(env_id, 1, 0)
  networks = agent.make_networks(jrl.env_spec(env), cfg)
  default, state = _train(agent.make_learner(networks, cfg), batches)
  explicit, _ = _train(agent.make_learner(networks, cfg, loss=agent.loss), batches)
  assert default == explicit
  init_digest = params_digest(agent.make_learner(networks, cfg).params(
      jax.jit(agent.make_learner(networks, cfg).init)(jax.random.PRNGKey(1))))
  assert default != init_digest  # the updates did change the parameters
  if name == "dqn":  # (a compile less for the others: ~10 s each on a loaded 2-core box)
    # An optimiser that never moves: the parameters stay at their initial bytes.
    frozen, _ = _train(agent.make_learner(networks, cfg, optimizer=optax.sgd(0.0)), batches)
    assert frozen == init_digest


def test_make_networks_takes_a_flax_module_or_an_init_apply_pair():
  cfg = dqn.Config()
  spec = jrl.env_spec(make_vector_env("CartPole-v1", 1, 0))
  key, obs = jax.random.PRNGKey(0), np.ones((5, 4), np.float32)
  default = dqn.make_networks(spec, cfg)
  same_module = dqn.make_networks(spec, cfg, module=QNetwork(spec.num_actions, cfg.hidden_sizes))
  pair = dqn.make_networks(spec, cfg, module=(default.init, default.apply))
  p = default.init(key)
  assert params_digest(same_module.init(key)) == params_digest(p) == params_digest(pair.init(key))
  np.testing.assert_array_equal(pair.apply(p, obs), default.apply(p, obs))

  class Linear(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.Dense(spec.num_actions, use_bias=False)(x)

  linear = dqn.make_networks(spec, cfg, module=Linear())
  params = linear.init(key)
  kernel = params["params"]["Dense_0"]["kernel"]
  assert kernel.shape == (4, 2)
  np.testing.assert_allclose(linear.apply(params, obs), obs @ np.asarray(kernel), rtol=1e-6)
  with pytest.raises(TypeError, match="flax.linen.Module or an \\(init, apply\\) pair"):
    dqn.make_networks(spec, cfg, module="mlp")


# --- LocalReplay -------------------------------------------------------------------------------

def test_calls_due_hand_values():
  spec = ReplaySpec(block_size=4, max_size=1000, min_size=100, samples_per_insert=8.0)
  assert [calls_due(r, spec, 16) for r in (0, 99, 100, 101, 102, 132)] == [0, 0, 1, 1, 2, 17]
  sequences = ReplaySpec(block_size=1, max_size=64, min_size=1, samples_per_insert=1.0, sequence_length=16)
  assert [calls_due(r, sequences, 4) for r in (0, 3, 4, 17)] == [0, 0, 1, 4]


def test_local_replay_writes_true_final_observations_and_schedules_updates():
  spec = ReplaySpec(block_size=1, max_size=10_000, min_size=100, samples_per_insert=8.0)
  replay = LocalReplay(spec, num_envs=4, seed=0, batch_size=16, n_step=1, discount=0.9)
  env = make_vector_env("CartPole-v1", 4, seed=0)
  obs, _ = env.reset(seed=0)
  finals = []  # the final observation of every episode end, in order
  for _ in range(40):
    action = np.zeros(4, np.int64)  # always left: episodes end within ~10 steps
    next_obs, reward, terminated, truncated, info = env.step(action)
    finals += [info["final_obs"][i].copy() for i in np.flatnonzero(terminated)]
    replay.add(obs, action, reward, terminated, truncated, next_obs, info)
    obs = next_obs
  storage = replay._buffer.state()["_storage"]
  assert replay.rows == 160 and len(finals) >= 4
  ended = storage.discount[:160, 0] == 0.0  # termination: no bootstrap
  np.testing.assert_array_equal(storage.next_observation[:160, 0][ended], np.stack(finals))
  np.testing.assert_allclose(storage.discount[:160, 0][~ended], 0.9)
  assert replay.updates_due() == calls_due(160, spec, 16) == (60 * 8) // 16 + 1
  batch = replay.sample(5)
  assert batch.transitions.observation.shape == (5, 16, 4) and batch.weights.shape == (5, 16)
  assert replay.updates_due() == 31 - 5


def test_local_replay_refuses_envs_that_do_not_autoreset_in_the_same_step():
  cfg = dqn.Config(min_replay_size=64, batch_size=8)
  next_step = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")  # gymnasium's default
  with pytest.raises(ConfigError, match="env: the vector env autoresets with AutoresetMode.NEXT_STEP"):
    LocalReplay.for_agent(cfg, 2, 0, env=next_step)
  replay = LocalReplay.for_agent(cfg, 2, 0)
  obs, _ = next_step.reset(seed=0)
  with pytest.raises(ConfigError, match="without info\\['final_obs'\\]"):
    for _ in range(100):
      next_obs, reward, terminated, truncated, info = next_step.step(np.zeros(2, np.int64))
      replay.add(obs, np.zeros(2, np.int64), reward, terminated, truncated, next_obs, info)
      obs = next_obs
  assert replay.rows < 20  # refused at the first episode end, before the step across it


def test_local_replay_same_seed_same_batches_and_sequences():
  cfg = dqn.Config(min_replay_size=64, batch_size=8, block_size=4)
  a, b = LocalReplay.for_agent(cfg, 4, seed=7), LocalReplay.for_agent(cfg, 4, seed=7)
  for replay in (a, b):
    _random_steps(replay, "CartPole-v1", 4, 30, seed=1)
  for leaf_a, leaf_b in zip(jax.tree_util.tree_leaves(a.sample(3)), jax.tree_util.tree_leaves(b.sample(3))):
    np.testing.assert_array_equal(leaf_a, leaf_b)

  pcfg = ppo.Config(batch_size=4, sequence_length=8, num_minibatches=4)
  replay = LocalReplay.for_agent(pcfg, 4, seed=0)
  _random_steps(replay, "CartPole-v1", 4, 24, _uniform_behaviour(2))
  assert replay.rows == 12 and replay.updates_due() == 3
  batch = replay.sample(2)
  assert batch.transitions.observation.shape == (2, 4, 8, 4)
  assert batch.transitions.extras["log_prob"].shape == (2, 4, 8)
  assert replay.updates_due() == 1


def test_local_replay_makes_r2d2_sequences_as_the_runner_does():
  """R2D2's overlapping sequences: the same batches as the embedded runner's own pieces
  (seeded buffer, adder, block writer, assembler), and priorities go back to their items."""
  _, cfg, env_id, _ = AGENT_CASES["r2d2"]
  replay = LocalReplay.for_agent(cfg, num_envs=8, seed=3)
  _random_steps(replay, env_id, 8, 24, _extras_fn("r2d2"))
  assert replay.rows == 8 * 5  # sequences of 8 complete at steps 8, 12, 16, 20, 24
  spec = cfg.replay_spec()
  buffer = SeededReplayBuffer(spec, seed=3)
  writer = make_block_writer(spec, buffer)
  adder = spec.kind.make_adder(8)
  env = make_vector_env(env_id, 8, 0)
  obs, _ = env.reset(seed=0)
  for _ in range(24):
    action = env.action_space.sample()
    next_obs, reward, terminated, truncated, info = env.step(action)
    done = np.logical_or(terminated, truncated)
    writer.add(adder.add(obs, action, np.asarray(reward, np.float32), terminated, truncated,
                         final_observations(next_obs, done, info), _extras_fn("r2d2")(action)))
    obs = next_obs
  want = make_assembler(spec, 2, cfg.batch_size, np.random.default_rng(4))(buffer.sample(2 * cfg.batch_size))
  got = replay.sample(2)
  assert got.transitions.observation.shape == (2, 4, 8, 4) and got.transitions.start_state.shape == (2, 4, R2D2_CORE)
  for leaf_got, leaf_want in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want.batch)):
    np.testing.assert_array_equal(leaf_got, leaf_want)
  replay.update_priorities(np.full((2, 4), 3.0))
  assert replay.updates_due() > 0


@pytest.mark.parametrize("name", ["dqn", "r2d2"])
def test_local_replay_saved_and_restored_goes_on_exactly(name):
  """A replay pickled mid-way and restored into a new LocalReplay adds and samples the same
  bytes as the one that went on (open n-step windows and partial blocks included)."""
  import pickle
  _, cfg, env_id, _ = AGENT_CASES[name]
  going_on = LocalReplay.for_agent(cfg, num_envs=8, seed=3)
  _random_steps(going_on, env_id, 8, 13, _extras_fn(name))  # mid-block, mid-sequence
  going_on.sample(1)
  restored = LocalReplay.for_agent(cfg, num_envs=8, seed=3)
  restored.restore(pickle.loads(pickle.dumps(going_on.state())))
  for replay in (going_on, restored):
    _random_steps(replay, env_id, 8, 11, _extras_fn(name), seed=5)
  assert restored.rows == going_on.rows and restored.updates_due() == going_on.updates_due() > 0
  for a, b in zip(jax.tree_util.tree_leaves(going_on.sample(2)), jax.tree_util.tree_leaves(restored.sample(2))):
    np.testing.assert_array_equal(a, b)


# --- Env factories -----------------------------------------------------------------------------

def test_env_factories_by_reference_or_callable():
  masked = make_vector_env("examples.envs:masked_cartpole", 3, seed=5)
  plain = make_vector_env("CartPole-v1", 3, seed=5)
  assert masked.single_observation_space.shape == (2,)
  assert masked.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP
  obs_m, _ = masked.reset(seed=5)
  obs_p, _ = plain.reset(seed=5)
  for _ in range(30):
    np.testing.assert_array_equal(obs_m, obs_p[:, [0, 2]])
    action = np.ones(3, np.int64)
    obs_m, _, term_m, _, info_m = masked.step(action)
    obs_p, _, term_p, _, info_p = plain.step(action)
    np.testing.assert_array_equal(term_m, term_p)
    if term_p.any():
      i = int(np.flatnonzero(term_p)[0])
      np.testing.assert_array_equal(info_m["final_obs"][i], info_p["final_obs"][i][[0, 2]])
  assert jrl.envs.reward_threshold("examples.envs:masked_cartpole") == 475.0

  cfg = dqn.Config()
  spec = jrl.env_spec(masked)
  policy = dqn.make_policy(dqn.make_networks(spec, cfg), cfg, evaluation=True)
  params = dqn.make_networks(spec, cfg).init(jax.random.PRNGKey(0))
  by_function = jrl.Evaluator(masked_cartpole, policy, 3, seed=11).run(params)
  by_reference = jrl.Evaluator("examples.envs:masked_cartpole", policy, 3, seed=11).run(params)
  assert by_function == by_reference and len(by_function) == 3 and min(by_function) >= 8


@pytest.mark.parametrize("ref, message", [
    ("examples.envs:broken_factory", "env: the env factory 'examples.envs:broken_factory' raised RuntimeError: "
                                     "this factory always fails"),
    ("examples.envs:not_an_env", "env: the env factory 'examples.envs:not_an_env' returned str, not a gymnasium.Env"),
    ("examples.envs:no_such_function", "env: 'examples.envs:no_such_function': module 'examples.envs' has no function"),
    ("examples.nowhere:factory", "env: cannot import 'examples.nowhere' for the env factory"),
])
def test_bad_env_factories_are_config_errors(ref, message):
  with pytest.raises(ConfigError) as error:
    jrl.envs.check_env_id(ref)
  assert str(error.value).startswith(message)


def test_get_agent_loads_modules_and_names_a_missing_piece(tmp_path, monkeypatch):
  (tmp_path / "mypkg").mkdir()
  (tmp_path / "mypkg" / "__init__.py").write_text("")
  (tmp_path / "mypkg" / "half_agent.py").write_text("from jrl.agents.dqn import Config, make_networks, make_learner\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  assert jrl.get_agent("examples.my_agent").Config().weight_decay > 0
  with pytest.raises(ConfigError, match="agent: module 'mypkg.half_agent' lacks make_policy, make_replay_spec"):
    jrl.get_agent("mypkg.half_agent")
  with pytest.raises(ConfigError, match="agent: cannot import agent module 'mypkg.nothing'"):
    jrl.get_agent("mypkg.nothing")
  with pytest.raises(ConfigError, match="agent: module 'examples.envs' lacks Config, make_networks"):
    jrl.get_agent("examples.envs")
  cfg = dataclasses.replace(jrl.get_agent("examples.my_agent").Config(), weight_decay=0.5)
  assert cfg.weight_decay == 0.5
