"""--actor_device: where an embedded run's policy acts (jrl.accelerators.actor_device, jrl.actors.actor.policy_device).

This host has no GPU: the rule is tested as a pure function (an accelerator host is its platform
'gpu'), the placement of a real policy on a second forced CPU device in a child process, and the
bad inputs through launch.train. A run names where each part ran (summary details["devices"],
report.md's devices line): a run in this process, and one with a learner of two forced CPU devices.
"""

import json
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from jrl.accelerators import ACTOR_CPU_MAX_FLOPS, actor_device
from jrl.agents import dqn
from jrl.cpu_jit import program_flops
from jrl.errors import ConfigError
from jrl.experiment.builder import build_agent_parts
from jrl.experiment.config import ExperimentConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_cpu_host_acts_on_the_cpu_and_refuses_the_accelerator():
  assert actor_device("auto", "cpu", None) == "cpu"
  assert actor_device("auto", "cpu", 1e12) == "cpu"  # however big the policy: there is nothing else
  assert actor_device("cpu", "cpu") == "cpu"
  with pytest.raises(ConfigError, match=r"^actor_device: asks for the accelerator, but JAX sees only the CPU in "
                                        r"this process \(no GPU, or its JAX plugin is not installed: "
                                        r"make setup ACCEL=cuda12\)$"):
    actor_device("accelerator", "cpu")
  with pytest.raises(ConfigError, match="^actor_device: must be one of auto, cpu, accelerator, got 'gpu'$"):
    actor_device("gpu", "cpu")


def test_an_accelerator_host_picks_by_the_flops_of_a_call():
  assert actor_device("auto", "gpu", ACTOR_CPU_MAX_FLOPS) == "cpu"
  assert actor_device("auto", "gpu", ACTOR_CPU_MAX_FLOPS + 1) == "accelerator"
  assert actor_device("auto", "gpu", None) == "accelerator"  # no cost analysis: the learner's device
  assert actor_device("auto", "tpu", 10.0) == "cpu"
  # An explicit choice is kept, whatever the program costs.
  assert actor_device("cpu", "gpu", 1e12) == "cpu"
  assert actor_device("accelerator", "gpu", 10.0) == "accelerator"


def _dqn_flops(env_id: str, batch: int, cfg: dqn.Config) -> float:
  parts = build_agent_parts("dqn", env_id, cfg)
  learner = parts.agent.make_learner(parts.networks, cfg)
  params = learner.params(learner.init(jax.random.PRNGKey(0)))
  policy = parts.agent.make_policy(parts.networks, cfg)
  spec = parts.env_spec
  obs = jax.ShapeDtypeStruct((batch, *spec.observation_shape), spec.observation_dtype)
  state = jax.eval_shape(lambda k: policy.init(k, batch), jax.random.PRNGKey(0))
  return program_flops(policy.select_action, params, obs, jax.ShapeDtypeStruct((batch,), np.bool_), state)


def test_the_default_on_a_gpu_host_for_real_policies():
  """DQN's CartPole MLP (4 -> 128 -> 128 -> 2): 2 * (4*128 + 128*128 + 128*2) = 34,304 FLOPs of
  matmuls an env, plus biases, ReLUs and the epsilon-greedy pick (XLA counts them too, a few
  percent): on the CPU up to 28 envs, on the GPU from 32. MinAtar's CNN (a 3x3 conv of 16
  filters on 10x10x4 planes, 2 * 10*10*16*3*3*4 = 115,200, then 1,600 -> 128 -> 3: 2 * (1600*128
  + 128*3) = 410,368 FLOPs of matmuls an env): on the CPU for one env, on the GPU from 8."""
  cfg = dqn.Config()
  assert cfg.hidden_sizes == (128, 128)
  matmuls = 2 * (4 * 128 + 128 * 128 + 128 * 2)
  for batch, where in ((8, "cpu"), (28, "cpu"), (32, "accelerator"), (256, "accelerator")):
    flops = _dqn_flops("CartPole-v1", batch, cfg)
    assert batch * matmuls <= flops <= 1.05 * batch * matmuls, (batch, flops)
    assert actor_device("auto", "gpu", flops) == where, (batch, flops)
  assert actor_device("auto", "gpu", _dqn_flops("MinAtar/Breakout-v1", 1, cfg)) == "cpu"
  assert actor_device("auto", "gpu", _dqn_flops("MinAtar/Breakout-v1", 8, cfg)) == "accelerator"


_CHILD = textwrap.dedent("""
  import json, jax, numpy as np
  from jrl import envs
  from jrl.actors.actor import GroupedPolicy, LocalPolicy, policy_device
  from jrl.actors.variables import VariableClient
  from jrl.agents import dqn
  from jrl.errors import ConfigError

  class Source:
    def __init__(self, params):
      self.params, self.version = params, 0
    def get_variables(self):
      return self.params, self.version

  cfg = dqn.Config(hidden_sizes=(8,))
  env = envs.make_vector_env("CartPole-v1", 4, seed=0)
  networks = dqn.make_networks(envs.env_spec(env), cfg)
  fns = dqn.make_policy(networks, cfg)
  obs, _ = env.reset(seed=0)
  obs = np.asarray(obs, np.float32)
  first = np.ones(4, bool)
  second = jax.devices()[1]
  out = {"devices": [str(d) for d in jax.devices()]}
  source = Source(networks.init(jax.random.PRNGKey(0)))
  variables = VariableClient(source, update_period=1)
  leaf = lambda tree: jax.tree_util.tree_leaves(tree)[0]
  out["client_before"] = [str(d) for d in leaf(variables.params).devices()]
  policy = LocalPolicy(fns, variables, jax.random.PRNGKey(1), num_envs=4, device=second)
  action = policy(obs, first)
  out["action"] = [str(d) for d in action.devices()]
  out["state"] = sorted({str(d) for x in jax.tree_util.tree_leaves(policy._state) for d in x.devices()})
  source.params, source.version = networks.init(jax.random.PRNGKey(5)), 1  # the learner's next version
  copies = variables.copies
  action = policy(obs, first)
  out["refreshed"] = [variables.copies - copies, [str(d) for d in leaf(variables.params).devices()],
                      [str(d) for d in action.devices()]]
  policy.restore(policy.state())
  out["restored"] = sorted({str(d) for x in jax.tree_util.tree_leaves(policy._state) for d in x.devices()})
  grouped = GroupedPolicy(fns, VariableClient(source), jax.random.PRNGKey(1), 4, 2, device=second)
  out["grouped"] = [str(d) for d in grouped.groups[1](obs[2:], first[2:]).devices()]
  # On this CPU host 'auto' and 'cpu' are this process's first CPU device; 'accelerator' is refused.
  spec = envs.env_spec(env)
  pick = lambda setting: str(policy_device(setting, fns, variables.params, spec.observation_shape,
                                           spec.observation_dtype, 4, jax.random.PRNGKey(1)))
  out["auto"], out["cpu"] = pick("auto"), pick("cpu")
  try:
    pick("accelerator")
  except ConfigError as e:
    out["accelerator"] = str(e)
  print(json.dumps(out))
""")


def test_the_policy_acts_on_its_device_and_its_parameters_follow_it():
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
  result = subprocess.run([sys.executable, "-c", _CHILD], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  out = json.loads(result.stdout.strip().splitlines()[-1])
  first, second = out["devices"]
  assert out["client_before"] == [first]  # a variable client's default: the process's first device
  assert out["action"] == [second] and out["state"] == [second]
  assert out["refreshed"] == [1, [second], [second]]  # a new version is put on the policy's device
  assert out["restored"] == [second]
  assert out["grouped"] == [second]
  assert out["auto"] == out["cpu"] == first
  assert out["accelerator"].startswith("actor_device: asks for the accelerator, but JAX sees only the CPU")


def _train(tmp_path, *flags):
  run_dir = tmp_path / "run"
  result = subprocess.run([sys.executable, "-m", "launch.train", "--agent", "dqn", "--env", "CartPole-v1",
                           "--steps", "1000", "--deterministic", "--run_dir", str(run_dir), *flags],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
  return result, run_dir


@pytest.mark.parametrize("flags, line", [
    (["--actor_device", "gpu"], "actor_device: must be 'auto', 'cpu' or 'accelerator', got 'gpu'"),
    (["--actor_device", "accelerator"], "actor_device: asks for the accelerator, but JAX sees only the CPU in "
                                        "this process (no GPU, or its JAX plugin is not installed: make setup "
                                        "ACCEL=cuda12)"),
])
def test_bad_actor_device_is_one_line_and_writes_nothing(tmp_path, flags, line):
  result, run_dir = _train(tmp_path, *flags)
  assert result.returncode == 2, result.stderr[-2000:]
  assert result.stderr.strip().splitlines() == [f"python -m launch.train: error: {line}"], result.stderr
  assert not run_dir.exists()


def test_actor_device_is_refused_for_a_distributed_run_and_a_device_run():
  with pytest.raises(ConfigError) as given_to_a_program:
    ExperimentConfig(distributed=True).check_given_flags({"actor_device"})
  assert "actor_device" in str(given_to_a_program.value) and "distributed" in str(given_to_a_program.value)
  with pytest.raises(ConfigError) as with_device_backend:
    ExperimentConfig(backend="device", actor_device="cpu")
  assert with_device_backend.value.field == "actor_device"
  ExperimentConfig(backend="device")  # the default says nothing


def test_an_embedded_run_names_the_devices_each_part_ran_on(tmp_path):
  from jrl.run.embedded import run
  exp = ExperimentConfig(agent="dqn", env="CartPole-v1", steps=1_000, deterministic=True, eval_every=1_000,
                         eval_episodes=2, progress_seconds=0, run_dir=str(tmp_path / "run"))
  summary = run(exp, dqn.Config(hidden_sizes=(8,), min_replay_size=200))
  details = summary["details"]
  assert details["devices"] == {"learner": ["cpu:0"], "actor": ["cpu:0"], "evaluator": ["cpu:0"]}
  assert details["actor_device"] == "auto"  # the setting; details["devices"]["actor"] is what it picked
  with open(tmp_path / "run" / "summary.json") as f:
    assert json.load(f)["details"]["devices"] == details["devices"]
  report = (tmp_path / "run" / "report.md").read_text()
  assert "\n## devices\n\nlearner: cpu:0; actor: cpu:0 (--actor_device auto); evaluator: cpu:0\n" in report


@pytest.mark.slow  # a launch.train process
def test_a_learner_over_two_devices_is_named_device_by_device(tmp_path):
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
  run_dir = tmp_path / "run"
  result = subprocess.run([sys.executable, "-m", "launch.train", "--agent", "dqn", "--env", "CartPole-v1",
                           "--steps", "1000", "--deterministic", "--learner_devices", "2", "--actor_device", "cpu",
                           "--min_replay_size", "200", "--eval_episodes", "2", "--progress_seconds", "0",
                           "--run_dir", str(run_dir)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  details = json.loads((run_dir / "summary.json").read_text())["details"]
  # The policy and the evaluator act on the process's first device, the learner's mesh spans both.
  assert details["devices"] == {"learner": ["cpu:0", "cpu:1"], "actor": ["cpu:0"], "evaluator": ["cpu:0"]}
  assert details["actor_device"] == "cpu"
  line = "learner: cpu:0, cpu:1; actor: cpu:0 (--actor_device cpu); evaluator: cpu:0"
  assert line in (run_dir / "report.md").read_text()
