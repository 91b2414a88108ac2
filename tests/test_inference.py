"""Central batched inference in one process: batching, per-actor state, equality with the pure policy."""

import threading
import time

import jax
import numpy as np
import pytest

from jrl.actors.inference import BatchedInference, InferenceClient
from jrl.actors.variables import VariableClient
from jrl.agents import dqn
from jrl.specs import EnvSpec

SPEC = EnvSpec((4,), np.dtype(np.float32), (), np.dtype(np.int32), num_actions=3)


class _Source:
  def __init__(self, params):
    self.params = params

  def get_variables(self):
    return self.params, 7


def test_requests_from_several_actors_are_batched_and_answered_like_the_pure_policy():
  cfg = dqn.Config(hidden_sizes=(16,), eval_epsilon=0.0)
  networks = dqn.make_networks(SPEC, cfg)
  params = networks.init(jax.random.PRNGKey(0))
  greedy = dqn.make_policy(networks, cfg, evaluation=True)
  num_actors, num_envs, steps = 3, 5, 20
  server = BatchedInference(greedy, VariableClient(_Source(params)), jax.random.PRNGKey(1), num_actors, num_envs,
                            SPEC.observation_shape, timeout_ms=200.0)
  stop = threading.Event()
  serving = threading.Thread(target=server.serve, args=(stop,), daemon=True)
  serving.start()

  rng = np.random.default_rng(0)
  observations = rng.normal(size=(num_actors, steps, num_envs, 4)).astype(np.float32)
  results = {}
  barrier = threading.Barrier(num_actors)

  def act(actor_id):
    client = InferenceClient(server.infer, actor_id)
    out = []
    for t in range(steps):
      barrier.wait()  # all actors ask at once, as lock-stepped actors would
      out.append(client(observations[actor_id, t], np.zeros(num_envs, bool)))
    results[actor_id] = (np.stack(out), client.version)

  threads = [threading.Thread(target=act, args=(i,)) for i in range(num_actors)]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join(timeout=60)
  stop.set()

  for actor_id in range(num_actors):
    actions, version = results[actor_id]
    expected = np.asarray(networks.apply(params, observations[actor_id].reshape(-1, 4)).argmax(-1))
    np.testing.assert_array_equal(actions.reshape(-1), expected)
    assert version == 7
  stats = server.stats()
  assert sum(k * v for k, v in server.batch_size_counts.items()) == num_actors * steps
  assert stats["batch_mean"] == pytest.approx(num_actors * steps / stats["batches"])
  assert stats["batch_mean"] > 1.5  # lock-stepped actors share batches


def test_each_actor_keeps_its_own_policy_state():
  cfg = dqn.Config(hidden_sizes=(8,), epsilon_decay_steps=100)
  networks = dqn.make_networks(SPEC, cfg)
  server = BatchedInference(dqn.make_policy(networks, cfg), VariableClient(_Source(networks.init(jax.random.PRNGKey(0)))),
                            jax.random.PRNGKey(1), num_actors=2, num_envs=4, obs_shape=(4,), timeout_ms=1.0)
  stop = threading.Event()
  threading.Thread(target=server.serve, args=(stop,), daemon=True).start()
  client = InferenceClient(server.infer, 1)
  for _ in range(3):
    client(np.zeros((4, 4), np.float32), np.zeros(4, bool))
  stop.set()
  # Only actor 1 stepped: its exploration schedule advanced by 3 x 4 env steps, actor 0's did not.
  np.testing.assert_array_equal(np.asarray(server._states.env_steps), [0, 12])


def test_steady_state_batches_hold_what_is_in_flight():
  """N actor threads that step their envs (2 ms, off the GIL like an env in another process)
  between requests: once warm, a batch holds >= 0.75 N of them on average."""
  cfg = dqn.Config(hidden_sizes=(32, 32))
  networks = dqn.make_networks(SPEC, cfg)
  num_actors, num_envs, warmup, steps = 4, 8, 10, 60
  server = BatchedInference(dqn.make_policy(networks, cfg), VariableClient(_Source(networks.init(jax.random.PRNGKey(0)))),
                            jax.random.PRNGKey(1), num_actors, num_envs, SPEC.observation_shape, timeout_ms=10.0)
  stop = threading.Event()
  threading.Thread(target=server.serve, args=(stop,), daemon=True).start()
  warm = threading.Barrier(num_actors + 1)
  done = []

  def act(actor_id):
    client = InferenceClient(server.infer, actor_id)
    obs = np.zeros((num_envs, 4), np.float32)
    for t in range(warmup + steps):
      if t == warmup:
        warm.wait()
      client(obs, np.zeros(num_envs, bool))
      time.sleep(0.002)
    done.append(actor_id)

  threads = [threading.Thread(target=act, args=(i,), daemon=True) for i in range(num_actors)]
  for thread in threads:
    thread.start()
  warm.wait(timeout=120)
  before = dict(server.batch_size_counts)
  for thread in threads:
    thread.join(timeout=120)
  stop.set()
  assert sorted(done) == list(range(num_actors))
  after = {k: v - before.get(k, 0) for k, v in server.batch_size_counts.items()}
  requests, batches = sum(k * v for k, v in after.items()), sum(after.values())
  assert requests >= num_actors * (steps - 1)  # the warm-up barrier may split one round
  assert requests / batches >= 0.75 * num_actors, after
  # The serving thread's phases cover its wall time; it computed once per batch.
  times = server.timer.node("inference/0", "inference")
  assert abs(times.accounted - times.wall) <= 0.05 * times.wall
  assert server.timer.calls["policy"] == sum(server.batch_size_counts.values())
