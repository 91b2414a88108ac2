"""Evaluations that end in bounded time, on Atari as elsewhere: the episode cap, the evaluation
epsilon of value agents, FIRE at reset (ALE games that wait for it), the stop predicate a signal
sets, and the atari presets. Real gymnasium and ale-py envs; a slow test sends SIGTERM to a real
`launch.train` Breakout run during its first evaluation."""

import os
import queue
import signal
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jrl import envs, pixel_envs
from jrl.actors.evaluator import EvaluationAbandoned, Evaluator
from jrl.agents import dqn, exploration
from jrl.experiment.checkpoint import Checkpointer
from jrl.types import ActorState, PolicyFns, initial_actor_state

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOOP = 0


def _constant_policy(action: int) -> PolicyFns:
  """Always `action` (Breakout's NOOP never launches a ball: without FIRE a game never ends)."""

  def select_action(params, obs, is_first, state: ActorState):
    del params, is_first
    return jnp.full((obs.shape[0],), action, jnp.int32), {}, state

  return PolicyFns(init=initial_actor_state, select_action=select_action)


def _random_policy() -> PolicyFns:
  """Uniform actions drawn from the evaluation's key (epsilon 1): returns depend on that key."""
  cfg = dqn.Config(eval_epsilon=1.0)
  return exploration.epsilon_greedy_policy(lambda params, obs: jnp.zeros((obs.shape[0], 2)), cfg, evaluation=True)


class _StepCounter:
  """A stop predicate that counts the steps it is asked after and says stop at `stop_at` (None: never)."""

  def __init__(self, stop_at=None):
    self.calls, self.stop_at = 0, stop_at

  def __call__(self) -> bool:
    self.calls += 1
    return self.stop_at is not None and self.calls >= self.stop_at


def test_the_episode_cap_is_atari_s_27000_agent_steps_and_none_elsewhere():
  assert pixel_envs.ATARI_MAX_EPISODE_STEPS == 108_000 // 4 == 27_000
  assert pixel_envs.episode_step_cap("ALE/Breakout-v5") == 27_000
  assert pixel_envs.episode_step_cap("ALE/Breakout-v5@none") is None  # the raw env: its own limit
  assert pixel_envs.episode_step_cap("CartPole-v1") is None
  assert pixel_envs.episode_step_cap("MinAtar/Breakout-v1") is None  # its preset's TimeLimit
  evaluator = Evaluator("ALE/Breakout-v5", _constant_policy(NOOP), 1, seed=0)
  assert evaluator.max_episode_steps == 27_000
  evaluator.close()


def test_an_evaluation_of_a_game_that_never_ends_stops_at_the_cap():
  # Raw Breakout under NOOP: no ball, no reward, no end; the cap of 40 steps ends it.
  counter = _StepCounter()
  evaluator = Evaluator("ALE/Breakout-v5@none", _constant_policy(NOOP), 2, seed=0, max_episode_steps=40,
                        should_stop=counter)
  assert evaluator.run(None) == [0.0, 0.0]
  assert counter.calls == 40 and evaluator.next_index == 1
  evaluator.close()
  # CartPole: reward 1 a step; pushing left topples the pole only after 8 steps or more, so a cap
  # of 5 ends each episode with return 5.
  evaluator = Evaluator("CartPole-v1", _constant_policy(0), 3, seed=0, max_episode_steps=5)
  assert evaluator.run(None) == [5.0, 5.0, 5.0]
  evaluator.close()


def test_the_stop_predicate_abandons_an_evaluation_and_leaves_the_evaluator_before_it():
  counter = _StepCounter(stop_at=7)
  evaluator = Evaluator("ALE/Breakout-v5@none", _constant_policy(NOOP), 2, seed=0, should_stop=counter)
  with pytest.raises(EvaluationAbandoned) as abandoned:
    evaluator.run(None)
  assert (abandoned.value.index, abandoned.value.steps, counter.calls) == (0, 7, 7)
  assert evaluator.next_index == 0
  evaluator.close()
  # Abandoned, then made whole: the same returns as evaluation 0 of an evaluator never stopped
  # (the env seeds and the policy key are still evaluation 0's).
  stop_once = _StepCounter(stop_at=3)
  stopped = Evaluator("CartPole-v1", _random_policy(), 4, seed=5, should_stop=stop_once)
  with pytest.raises(EvaluationAbandoned):
    stopped.run(None)
  stop_once.stop_at = None
  fresh = Evaluator("CartPole-v1", _random_policy(), 4, seed=5)
  assert stopped.run(None) == fresh.run(None)
  assert stopped.state()["count"] == fresh.state()["count"] == 1
  np.testing.assert_array_equal(stopped.state()["key"], fresh.state()["key"])
  stopped.close()
  fresh.close()


def test_a_long_evaluation_prints_progress_lines():
  lines = []
  evaluator = Evaluator("ALE/Breakout-v5@none", _constant_policy(NOOP), 2, seed=0, max_episode_steps=30,
                        progress=lines.append, progress_seconds=0.0)
  evaluator.run(None)
  assert len(lines) == 30 and lines[0] == "eval 0: 0/2 episodes done, 1 steps"
  assert lines[-1] == "eval 0: 0/2 episodes done, 30 steps"
  evaluator.close()


@pytest.mark.parametrize("epsilon", [0.001, 0.2])
def test_eval_epsilon_draws_random_actions_at_its_rate_from_the_key(epsilon):
  # Q prefers action 0 of 4; a random action is uniform over all 4, so an action other than 0
  # comes at epsilon * 3/4 (0.00075 and 0.15), each of the others at epsilon / 4.
  batch = 100_000  # 5 sigma of epsilon 0.001 is still below its rate: a policy ignoring epsilon fails
  q_apply = lambda params, obs: jnp.tile(jnp.array([1.0, 0.0, 0.0, 0.0]), (obs.shape[0], 1))
  policy = exploration.epsilon_greedy_policy(q_apply, dqn.Config(eval_epsilon=epsilon), evaluation=True)
  obs = jnp.zeros((batch, 1))
  action, _, _ = jax.jit(policy.select_action)(None, obs, jnp.ones(batch, bool),
                                               policy.init(jax.random.PRNGKey(0), batch))
  counts = np.bincount(np.asarray(action), minlength=4) / batch
  std = np.sqrt(epsilon * 0.75 * (1 - epsilon * 0.75) / batch)
  assert abs((1 - counts[0]) - epsilon * 0.75) < 5 * std
  np.testing.assert_allclose(counts[1:], epsilon / 4, atol=5 * np.sqrt(epsilon / 4 / batch))
  greedy = exploration.epsilon_greedy_policy(q_apply, dqn.Config(eval_epsilon=0.0), evaluation=True)
  action, _, _ = greedy.select_action(None, obs[:100], jnp.ones(100, bool), greedy.init(jax.random.PRNGKey(0), 100))
  assert not np.asarray(action).any()


def _episode_ends_under_noops(env_id, evaluation, steps=200):
  """The steps (1-based) at which episodes ended, and the lives before each of those steps."""
  env = envs.make_vector_env(env_id, 1, seed=0, evaluation=evaluation)
  ale = env.envs[0].unwrapped.ale
  ends = []
  for step in range(1, steps + 1):
    lives = ale.lives()
    _, _, terminated, truncated, _ = env.step(np.array([NOOP]))
    if terminated[0] or truncated[0]:
      ends.append((step, lives))
  env.close()
  return ends


def test_fire_is_pressed_at_reset_and_after_a_lost_life_on_breakout_through_the_atari_preset():
  # Under NOOPs each ball FIRE launches is missed 23 steps later (seed 0; FIRE and RIGHT count as
  # one step). Training: each lost life ends an episode, and its reset presses FIRE again.
  assert _episode_ends_under_noops("ALE/Breakout-v5", evaluation=False)[:5] == [(23, 5), (46, 4), (69, 3), (92, 2),
                                                                               (115, 1)]
  # Evaluation: FIRE after each lost life too, so the whole game of 5 balls ends at the same step.
  assert _episode_ends_under_noops("ALE/Breakout-v5", evaluation=True)[:1] == [(115, 1)]
  # Raw Breakout: no FIRE, no ball, no end.
  assert _episode_ends_under_noops("ALE/Breakout-v5@none", evaluation=True) == []


def test_fire_reset_wraps_only_games_with_a_fire_action():
  def wrappers(env_id):
    env = pixel_envs.factory(env_id, evaluation=True)()
    names = []
    while hasattr(env, "env"):
      names.append(type(env).__name__)
      env = env.env
    return names
  assert "FireReset" in wrappers("ALE/Breakout-v5") and "FireReset" in wrappers("ALE/Pong-v5")
  assert "FireReset" not in wrappers("ALE/Freeway-v5")  # NOOP, UP, DOWN


@pytest.mark.parametrize("agent", ["dqn", "ppo", "impala", "r2d2"])
def test_the_atari_presets_carry_the_evaluation_protocol(agent):
  from launch.sweep import check_train_flags
  exp, cfg = check_train_flags(agent, "ALE/Breakout-v5", 0, ["--preset", "atari"])
  assert (exp.preset, exp.eval_every, exp.eval_episodes, exp.steps) == ("atari", 250_000, 5, 50_000)
  assert getattr(cfg, "eval_epsilon", 0.001) == 0.001  # value agents' epsilon; PPO and IMPALA have none
  assert cfg.torso in ("nature_cnn", "impala_resnet")


def _read_lines(stream, lines: "queue.Queue[str]") -> None:
  for line in stream:
    lines.put(line)


def _sigterm_during_first_evaluation(args, run_dir):
  """Starts a run, sends SIGTERM at its first evaluation progress line; (exit status, seconds from
  the signal to the exit, stderr)."""
  proc = subprocess.Popen([sys.executable, "-m", "launch.train", *args, "--run_dir", run_dir], cwd=ROOT, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  lines: "queue.Queue[str]" = queue.Queue()
  threading.Thread(target=_read_lines, args=(proc.stdout, lines), daemon=True).start()
  deadline = time.monotonic() + 240
  while True:
    assert proc.poll() is None, f"the run ended before its evaluation: {proc.communicate()[1][-3000:]}"
    assert time.monotonic() < deadline, "no evaluation progress line in time"
    try:
      if "eval 0: " in lines.get(timeout=1):
        break
    except queue.Empty:
      pass
  proc.send_signal(signal.SIGTERM)
  sent = time.monotonic()
  err = proc.stderr.read()
  proc.wait(timeout=60)
  return proc.returncode, time.monotonic() - sent, err


@pytest.mark.slow
def test_sigterm_during_a_breakout_evaluation_exits_143_within_10_s_and_resume_continues(tmp_path):
  # The atari preset, its first evaluation at 400 env steps (no learning: the replay fills to 5000
  # first), of 32 whole games (a few hundred steps each for untrained parameters, 32 Nature CNN
  # inputs a step: longer than the second after which it prints its first progress line).
  args = ["--agent", "dqn", "--env", "ALE/Breakout-v5", "--preset", "atari", "--steps", "2000",
          "--eval_every", "400", "--eval_episodes", "32", "--min_replay_size", "5000", "--max_replay_size", "5000",
          "--progress_seconds", "0.2"]
  run_dir = str(tmp_path / "run")
  status, seconds, err = _sigterm_during_first_evaluation(args, run_dir)
  assert status == 143 and seconds < 10, (status, seconds, err[-3000:])
  assert not os.path.exists(os.path.join(run_dir, "policies", "best.msgpack"))  # no evaluation was recorded
  checkpoints = Checkpointer(run_dir).all()
  assert len(checkpoints) == 1
  steps = Checkpointer(run_dir).verify(checkpoints[0]).manifest["counters"]["actor_steps"]
  assert 400 <= steps < 2000 and steps % 4 == 0  # the last whole advance: 4 envs a step
  assert f"checkpoint written at {steps:.0f} env steps" in err.strip().splitlines()[-1]
  # --resume continues from that checkpoint, with the abandoned evaluation 0 first (stopped again).
  status, seconds, err = _sigterm_during_first_evaluation(["--resume", run_dir], run_dir)
  assert status == 143 and seconds < 10, (status, seconds, err[-3000:])
  resumed = Checkpointer(run_dir).all()
  assert Checkpointer(run_dir).verify(resumed[-1]).manifest["counters"]["actor_steps"] == steps
