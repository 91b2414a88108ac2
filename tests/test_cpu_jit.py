"""jrl.cpu_jit: compiler options for small per-step programs, synchronous CPU dispatch."""

import os
import subprocess
import sys

import jax
import numpy as np

from jrl import cpu_jit
from jrl.agents import dqn
from jrl.specs import EnvSpec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _policy_and_inputs(obs_shape, obs_dtype, num_actions, batch, hidden_sizes=(64, 64)):
  spec = EnvSpec(obs_shape, np.dtype(obs_dtype), (), np.dtype(np.int32), num_actions=num_actions)
  cfg = dqn.Config(hidden_sizes=hidden_sizes)
  networks = dqn.make_networks(spec, cfg)
  policy = dqn.make_policy(networks, cfg)
  params = networks.init(jax.random.PRNGKey(0))
  return policy, params, policy.init(jax.random.PRNGKey(1), batch)


def test_small_policy_gets_the_small_program_options_and_the_same_actions_bit_for_bit():
  policy, params, state = _policy_and_inputs((4,), np.float32, 2, 8)
  small, default = cpu_jit.jit_per_step(policy.select_action), jax.jit(policy.select_action)
  rng = np.random.default_rng(0)
  state_a = state_b = state
  for _ in range(20):
    obs, is_first = rng.normal(size=(8, 4)).astype(np.float32), np.zeros(8, bool)
    action_a, _, state_a = small(params, obs, is_first, state_a)
    action_b, _, state_b = default(params, obs, is_first, state_b)
    np.testing.assert_array_equal(np.asarray(action_a), np.asarray(action_b))
  np.testing.assert_array_equal(np.asarray(state_a.key), np.asarray(state_b.key))
  assert small.compiler_options, "a 0.075 MFLOP policy should run with the small-program options"
  assert small.compiler_options == cpu_jit.small_program_options()
  assert set(small.compiler_options) <= {name for name, _ in cpu_jit.SMALL_PROGRAM_OPTIONS}


def test_large_program_keeps_xla_defaults():
  policy, params, state = _policy_and_inputs((84, 84, 4), np.uint8, 6, 8)  # Nature CNN: ~150 MFLOP
  jitted = cpu_jit.jit_per_step(policy.select_action)
  jitted(params, np.zeros((8, 84, 84, 4), np.uint8), np.zeros(8, bool), state)
  assert jitted.compiler_options is None


def _dispatch_in_fresh_process(code: str, **env) -> str:
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**os.environ, **env})
  assert out.returncode == 0, out.stderr
  return out.stdout.strip().splitlines()[-1]


def test_dispatch_synchronously_before_the_first_array_and_not_after():
  before = ("import jax, jax.numpy as jnp\nfrom jrl import cpu_jit\nok = cpu_jit.dispatch_synchronously()\n"
            "jnp.zeros(1)\nprint(ok, jax.config.values['jax_cpu_enable_async_dispatch'], "
            "cpu_jit.dispatches_asynchronously())")
  assert _dispatch_in_fresh_process(before, JRL_CPU_ASYNC_DISPATCH="") == "True False False"
  assert _dispatch_in_fresh_process(before, JRL_CPU_ASYNC_DISPATCH="1") == "False True True"
  after = ("import jax, jax.numpy as jnp\nfrom jrl import cpu_jit\njnp.zeros(1)\n"
           "print(cpu_jit.dispatch_synchronously(), jax.config.values['jax_cpu_enable_async_dispatch'])")
  assert _dispatch_in_fresh_process(after, JRL_CPU_ASYNC_DISPATCH="") == "False True"


def test_choose_dispatch_makes_image_processes_asynchronous_and_leaves_vectors_synchronous():
  code = ("import sys, jax, jax.numpy as jnp\nfrom jrl import cpu_jit\ncpu_jit.dispatch_synchronously()\n"
          "shape = tuple(int(x) for x in sys.argv[1].split(','))\nok = cpu_jit.choose_dispatch(shape)\n"
          "jnp.zeros(1)\nprint(ok, cpu_jit.dispatches_asynchronously())")

  def run(shape: str, env: str) -> str:
    out = subprocess.run([sys.executable, "-c", code, shape], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "JRL_CPU_ASYNC_DISPATCH": env})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]

  assert run("10,10,4", "") == "True True"      # MinAtar planes
  assert run("84,84,4", "") == "True True"      # Atari frames
  assert run("4", "") == "False False"          # CartPole: stays synchronous
  assert run("84,84,4", "0") == "False False"   # kept synchronous on request
  assert run("4", "1") == "True True"           # JAX's default everywhere on request
  # Too late once JAX has made its CPU client: the process keeps what it has.
  late = ("import jax.numpy as jnp\nfrom jrl import cpu_jit\ncpu_jit.dispatch_synchronously()\njnp.zeros(1)\n"
          "print(cpu_jit.choose_dispatch((84, 84, 4)))")
  assert _dispatch_in_fresh_process(late, JRL_CPU_ASYNC_DISPATCH="") == "False"
