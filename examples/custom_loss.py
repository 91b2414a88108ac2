"""A custom DQN loss (squared TD error + L2 weight decay) plugged into the stock learner:
`dqn.make_learner(networks, cfg, loss=...)` takes any function with the default loss's
signature, `(networks, params, target_params, batch, cfg) -> (loss, td)`; nothing is forked.

    python -m examples.custom_loss [--seed 0] [--steps 20000] [--weight_decay 1e-4]
"""

import argparse
import functools
import sys
from typing import Optional, Sequence, Tuple

import jax
import jax.numpy as jnp

from examples.own_loop import train
from jrl import dqn
from jrl.types import Array, LearnerBatch, Params


def mse_weight_decay_loss(networks: dqn.Networks, params: Params, target_params: Params, batch: LearnerBatch,
                          cfg: dqn.Config, weight_decay: float = 1e-4) -> Tuple[Array, Array]:
  """mean(w * td^2) + weight_decay * sum of squared params; td [B] the n-step TD errors, double Q
  as `cfg.double_q` says (returned as aux: they give the priorities and `td_abs_mean`)."""
  td = dqn.td_errors(networks, params, target_params, batch, cfg.double_q)
  l2 = sum(jnp.sum(jnp.square(p)) for p in jax.tree_util.tree_leaves(params))
  return jnp.mean(batch.weights * jnp.square(td)) + weight_decay * l2, td


def make_loss(weight_decay: float) -> dqn.LossFn:
  return functools.partial(mse_weight_decay_loss, weight_decay=weight_decay)


def main(argv: Optional[Sequence[str]] = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m examples.custom_loss", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--steps", type=int, default=20_000, help="env-step budget")
  parser.add_argument("--weight_decay", type=float, default=1e-4)
  args = parser.parse_args(argv)
  result = train(args.seed, args.steps, module=None, loss=make_loss(args.weight_decay))
  best = max((score for _, score in result.evaluations), default=float("nan"))
  print(f"done: {result.env_steps} env steps, {result.updates} updates, best eval {best:.1f}, "
        f"{result.seconds:.1f}s")
  return 0


if __name__ == "__main__":
  sys.exit(main())
