"""A Launchpad launch script: jrl's distributed DQN program, plus a node of your own.

    .venv/bin/python -m examples.launch_script [--steps 30000] [--run_dir runs/launch-script]

`make_program` builds the program `launch.train --distributed` runs; this script adds a second
evaluator that scores the learner's greedy policy on CartPole with Gaussian noise on its
observations, into RUN_DIR/metrics/noisy_evaluator.csv. `launch_program` runs it as jrl does
(supervised local_mp, restarts, the run report); `lp.launch(built.program, launch_type="local_mp")`
would run it with Launchpad alone.
"""

import argparse

from launch.distributed import launch_program, make_program  # first: loads JAX's probability libraries before TF

import gymnasium as gym
import launchpad as lp
import numpy as np

import jrl
from jrl.experiment.config import ExperimentConfig
from jrl.experiment.logging import MetricsLogger


def noisy_cartpole(noise=0.1, seed=0):
  rng = np.random.default_rng(seed)
  env = gym.make("CartPole-v1")
  return gym.wrappers.TransformObservation(
      env, lambda obs: (obs + rng.normal(0.0, noise, obs.shape)).astype(np.float32), env.observation_space)


class NoisyEvaluator:
  """Every few seconds until the program stops: the learner's parameters, 5 greedy episodes."""

  def __init__(self, learner, counter, run_dir, agent_cfg):
    self._learner, self._counter, self._run_dir, self._cfg = learner, counter, run_dir, agent_cfg

  def run(self):
    env = jrl.make_vector_env(noisy_cartpole, 1, seed=0)
    networks = jrl.dqn.make_networks(jrl.env_spec(env), self._cfg)
    evaluator = jrl.Evaluator(noisy_cartpole, jrl.dqn.make_policy(networks, self._cfg, evaluation=True), 5, seed=0)
    logger = MetricsLogger(self._run_dir, "noisy_evaluator")
    while not lp.stop_event().wait(2.0):
      params, version = self._learner.get_variables()
      returns = evaluator.run(params)
      logger.write({"actor_steps": self._counter.get_counts().get("actor_steps", 0.0), "learner_version": version,
                    "noisy_eval_return": float(np.mean(returns))})
    logger.close()


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--steps", type=int, default=30_000)
  parser.add_argument("--run_dir", default="runs/launch-script")
  args = parser.parse_args(argv)
  cfg = jrl.dqn.Config()
  built = make_program(ExperimentConfig(agent="dqn", env="CartPole-v1", distributed=True, num_actors=2,
                                        steps=args.steps, run_dir=args.run_dir), cfg)
  with built.program.group("noisy_evaluator"):
    built.program.add_node(lp.CourierNode(NoisyEvaluator, built.nodes.learner, built.nodes.counter,
                                          built.run_dir, cfg))
  summary = launch_program(built)
  print(f"eval {summary['eval_return']:.1f} (best {summary['best_eval_return']:.1f}) | {summary['run_dir']}")


if __name__ == "__main__":
  main()
