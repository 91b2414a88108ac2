"""DQN with your own flax torso, in your own training loop (no runner, no Reverb).

    python -m examples.own_loop [--seed 0] [--steps 50000] [--num_envs 8]

The pieces: `dqn.make_networks(spec, cfg, module=...)` takes any flax module that maps
observations [B, *obs_shape] to Q-values [B, num_actions]; `jrl.LocalReplay` takes each
vector step as gymnasium returns it and says how many updates are due; the learner is the
stock `dqn.make_learner`, its updates scanned U at a time. Stops once the greedy policy
averages the env's threshold (475 on CartPole-v1) over 10 episodes.
"""

import argparse
import sys
import time
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import numpy as np

import jrl
from jrl import dqn


class LayerNormTorso(nn.Module):
  """Dense -> LayerNorm -> SiLU blocks; the input is flattened after the batch dim."""
  hidden_sizes: Sequence[int] = (128, 128)

  @nn.compact
  def __call__(self, obs: jax.Array) -> jax.Array:  # [B, *obs_shape] -> [B, hidden_sizes[-1]]
    x = obs.reshape(obs.shape[0], -1).astype(np.float32)
    for size in self.hidden_sizes:
      x = nn.silu(nn.LayerNorm()(nn.Dense(size)(x)))
    return x


class QHead(nn.Module):
  """The custom torso and a linear Q head: obs [B, ...] -> q [B, num_actions]."""
  num_actions: int

  @nn.compact
  def __call__(self, obs: jax.Array) -> jax.Array:
    return nn.Dense(self.num_actions)(LayerNormTorso()(obs))


class Result(NamedTuple):
  env_steps: int                      # env steps taken
  updates: int                        # SGD updates done
  evaluations: List[Tuple[int, float]]  # (env steps, mean greedy return)
  steps_to_threshold: Optional[int]   # env steps at the first evaluation >= threshold
  seconds: float


def train(seed: int = 0, steps: int = 50_000, num_envs: int = 8, updates_per_call: int = 8,
          eval_every: int = 2_500, eval_episodes: int = 10, env_id: str = "CartPole-v1",
          threshold: Optional[float] = None, module: Any = "torso", loss: Optional[dqn.LossFn] = None,
          cfg: Optional[dqn.Config] = None, verbose: bool = True) -> Result:
  """DQN in a loop of our own. `module`: "torso" (this file's `QHead`), None (dqn's default
  MLP) or any flax module obs -> q; `loss`: None (dqn's default) or any `dqn.LossFn`."""
  start = time.perf_counter()
  cfg = cfg if cfg is not None else dqn.Config()
  env = jrl.make_vector_env(env_id, num_envs, seed)
  spec = jrl.env_spec(env)
  threshold = threshold if threshold is not None else jrl.envs.reward_threshold(env_id)
  networks = dqn.make_networks(spec, cfg, module=QHead(spec.num_actions) if module == "torso" else module)
  learner = dqn.make_learner(networks, cfg, loss=loss)
  policy = dqn.make_policy(networks, cfg)
  evaluator = jrl.Evaluator(env_id, dqn.make_policy(networks, cfg, evaluation=True), eval_episodes, seed + 10_000)
  replay = jrl.LocalReplay.for_agent(cfg, num_envs, seed, env=env)

  learner_key, actor_key = jax.random.split(jax.random.PRNGKey(seed))
  state = jax.jit(learner.init)(learner_key)
  update_many = jax.jit(jrl.make_multi_update(learner.update))  # U updates per call: [U, B, ...] batches
  select_action = jax.jit(policy.select_action)
  actor_state = policy.init(actor_key, num_envs)

  obs, _ = env.reset(seed=seed)
  is_first = np.ones(num_envs, bool)  # [E] first step of an episode (recurrent policies reset there)
  env_steps, updates, evaluations, reached = 0, 0, [], None
  next_eval = eval_every
  while env_steps < steps:
    action, _, actor_state = select_action(learner.params(state), obs, is_first, actor_state)
    action = np.asarray(action)
    next_obs, reward, terminated, truncated, info = env.step(action)
    replay.add(obs, action, reward, terminated, truncated, next_obs, info)
    obs, is_first = next_obs, np.logical_or(terminated, truncated)  # the env reset those in the same step
    env_steps += num_envs
    while replay.updates_due() >= updates_per_call:
      state, _ = update_many(state, replay.sample(updates_per_call))
      updates += updates_per_call
    if env_steps >= next_eval:
      next_eval += eval_every
      score = float(np.mean(evaluator.run(learner.params(state))))
      evaluations.append((env_steps, score))
      if verbose:
        print(f"steps {env_steps} | updates {updates} | eval {score:.1f} | {time.perf_counter() - start:.0f}s",
              flush=True)
      if threshold is not None and score >= threshold:
        reached = env_steps
        break
  env.close()
  evaluator.close()
  return Result(env_steps, updates, evaluations, reached, time.perf_counter() - start)


def main(argv: Optional[Sequence[str]] = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m examples.own_loop", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--steps", type=int, default=50_000, help="env-step budget")
  parser.add_argument("--num_envs", type=int, default=8)
  parser.add_argument("--updates_per_call", type=int, default=8)
  parser.add_argument("--eval_every", type=int, default=2_500)
  args = parser.parse_args(argv)
  result = train(args.seed, args.steps, args.num_envs, args.updates_per_call, args.eval_every)
  print(f"done: {result.env_steps} env steps, {result.updates} updates, steps to threshold "
        f"{result.steps_to_threshold}, {result.seconds:.1f}s")
  return 0


if __name__ == "__main__":
  sys.exit(main())
