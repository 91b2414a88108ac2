"""Evaluate a saved policy of a run.

  python -m launch.evaluate RUN_DIR [--which best|final|latest] [--episodes N] [--seed S] [--video FILE.mp4]

Rebuilds the agent from RUN_DIR/config.json, loads RUN_DIR/policies/<which>.msgpack and
prints the mean ± std return of the run's evaluation policy over N episodes, one per env
(greedy; PPO's and IMPALA's sample their policy where the run's greedy_eval is false).
By default the episodes are those of the snapshot's own evaluation in the run (the
run's eval_episodes, the evaluator seed and evaluation index its .json records), so
`--which best` repeats the run's best evaluation exactly. `--seed S` runs other
episodes: env i resets with seed S + i. `--video` also writes those episodes, one
after another, to an H.264 MP4: a relative path is inside RUN_DIR (`--video best.mp4` writes
RUN_DIR/best.mp4, its folders made as needed), as the run's other outputs are, not in the current
folder; an absolute path is used as given.

Runs of `--backend device` (gymnax envs) are evaluated as their runs evaluated, on device: the
episodes of evaluation k reset with the key of the evaluator seed and k (`--seed S`: of S and 0).
"""

import argparse
import os
import sys
from typing import Any, Dict, Optional, Sequence, Tuple

from launch.cli import OneLineParser, end_process, fail

PROG = "python -m launch.evaluate"
_finished = False  # set once the evaluation is printed and its video written (`cli.end_process`)
EVAL_SEED_OFFSET = 10_000  # a run's evaluator is seeded exp.seed + 10_000


def evaluation_seed(exp, info: Dict[str, Any]) -> Tuple[int, int]:
  """(evaluator seed, evaluation index) of the snapshot's evaluation in the run; without a
  record, the run's first evaluation."""
  if "eval_seed" in info:
    return int(info["eval_seed"]), int(info.get("eval_index", 0))
  return exp.seed + EVAL_SEED_OFFSET, 0


def device_player(exp, policy, episodes: int):
  """play(params, seed, index) -> returns [episodes] of `policy` on the run's gymnax env, as the
  run's evaluation `index` with evaluator seed `seed` played them
  (`jrl.run.device.loop.evaluate_episodes`); compiled once for all the params it is given."""
  import jax
  import numpy as np
  from jrl.gymnax_envs import GymnaxVecEnv
  from jrl.run.device.loop import evaluate_episodes, evaluation_key
  env = GymnaxVecEnv(exp.env)
  play = jax.jit(lambda p, k: evaluate_episodes(env, policy, p, k, episodes))
  return lambda params, seed, index: np.asarray(play(params, evaluation_key(seed, index)))


def device_returns(exp, policy, params, episodes: int, seed: int, index: int):
  """Returns of a device run's policy over `episodes` gymnax envs, as the run's evaluation
  `index` with evaluator seed `seed` played them."""
  return device_player(exp, policy, episodes)(params, seed, index)


def _format(value) -> str:
  return f"{value:.3f}" if isinstance(value, float) else str(value)


def video_path(run_dir: str, path: str) -> str:
  """Where `--video PATH` writes: a relative PATH inside the run directory, so that a video of a
  run lies with the run (and `--video out.mp4` run from the repository root does not leave a file
  there); an absolute PATH as given."""
  return path if os.path.isabs(path) else os.path.join(run_dir, path)


def _check_video_path(path: str, inside_run: bool) -> None:
  """`path` as `video_path` resolved it; a missing folder is made inside a run, refused outside."""
  from jrl.errors import ConfigError
  if not path.lower().endswith(".mp4"):
    raise ConfigError("video", f"must name an .mp4 file, got '{path}'")
  if os.path.isdir(path):
    raise ConfigError("video", f"'{path}' is a folder")
  directory = os.path.dirname(os.path.abspath(path))
  if not inside_run and not os.path.isdir(directory):
    raise ConfigError("video", f"folder '{directory}' does not exist")


def main(argv: Optional[Sequence[str]] = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  from jrl.cpu_jit import dispatch_synchronously
  dispatch_synchronously()  # as runs evaluate (see its docstring)
  parser = OneLineParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (holds config.json and policies/)")
  parser.add_argument("--which", default="best", choices=("best", "final", "latest"),
                      help="the policy snapshot (default best)")
  parser.add_argument("--episodes", type=int, default=None, help="episodes (default: the run's eval_episodes)")
  parser.add_argument("--seed", type=int, default=None,
                      help="env i resets with seed + i (default: the snapshot's evaluation in the run)")
  parser.add_argument("--video", metavar="FILE.mp4", default=None,
                      help="also write the episodes to an MP4 (a relative path is inside RUN_DIR)")
  args = parser.parse_args(argv)

  import numpy as np
  from jrl.actors.evaluator import Evaluator
  from jrl.errors import ConfigError
  from jrl.experiment.snapshots import load_snapshot

  try:
    if args.episodes is not None and args.episodes <= 0:
      raise ConfigError("episodes", f"must be > 0, got {args.episodes}")
    snapshot = load_snapshot(args.run_dir, args.which)  # first: a missing run is named as such
    video = None if args.video is None else video_path(args.run_dir, args.video)
    if video is not None:
      _check_video_path(video, inside_run=not os.path.isabs(args.video))
    exp, parts = snapshot.experiment, snapshot.parts
    if video is not None and exp.backend == "device":
      raise ConfigError("video", f"the run's gymnax env ({exp.env}) does not render; videos are of gymnasium envs")
    if video is not None:
      from jrl.video import check_renders
      check_renders(exp.env)
  except ConfigError as e:
    fail(PROG, e)

  episodes = args.episodes or int(snapshot.info.get("eval_episodes", exp.eval_episodes))
  seed, index = evaluation_seed(exp, snapshot.info) if args.seed is None else (args.seed, 0)
  policy = parts.agent.make_policy(parts.networks, snapshot.agent_config, evaluation=True)
  if exp.backend == "device":
    returns = device_returns(exp, policy, snapshot.params, episodes, seed, index)
    resets = f"envs reset with the key of seed {seed} and evaluation {index}, on device"
  else:
    evaluator = Evaluator(exp.env, policy, episodes, seed, first_index=index,
                          progress=lambda line: print(f"[evaluate] {line}", flush=True))  # long Atari games
    try:
      returns = evaluator.run(snapshot.params)
    finally:
      evaluator.close()
    first = seed + 1000 * index
    resets = f"envs reset with seeds {first}..{first + episodes - 1}"

  info = ", ".join(f"{k} {_format(v)}" for k, v in snapshot.info.items())
  print(f"{args.which} policy of {args.run_dir}: {info}")
  print(f"return {np.mean(returns):.3f} ± {np.std(returns):.3f} over {episodes} episodes "
        f"({exp.env}, seed {seed}, evaluation {index}: {resets})", flush=True)

  if video is not None:
    from jrl.video import record_episodes
    os.makedirs(os.path.dirname(os.path.abspath(video)), exist_ok=True)
    stats = record_episodes(video, exp.env, policy, snapshot.params, episodes, seed, index)
    print(f"video: {video} ({episodes} episodes, returns {', '.join(f'{r:g}' for r in stats.returns)}; "
          f"{stats.frames} frames {stats.width}x{stats.height} at {stats.fps} fps, "
          f"{stats.bytes / 1e6:.2f} MB, {stats.seconds:.1f} s)")
  global _finished
  _finished = True  # printed, and the video (if any) written and closed
  return 0


if __name__ == "__main__":
  end_process(main(), _finished)
