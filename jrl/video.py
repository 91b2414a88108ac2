"""Episode videos: frames of gymnasium's `rgb_array` rendering streamed into an H.264 MP4.

Needs pygame (rendering of the classic-control envs) and imageio with imageio-ffmpeg
(its wheel ships the ffmpeg binary); both are imported only when a video is made.
"""

import os
import tempfile
import time
import warnings
from typing import Any, Callable, List, NamedTuple

import gymnasium as gym
import numpy as np

from jrl.errors import ConfigError


def check_renders(env_id) -> int:
  """The env's frames per second; ConfigError("video") if it cannot render `rgb_array` frames.
  `env_id`: anything the evaluator takes (a gymnasium id, a pixel preset, an env factory or
  `pkg.module:function`); the env is made as the evaluator will make it."""
  from jrl.envs import make_vector_env
  os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # rgb_array needs no display; quiets SDL
  try:
    env = make_vector_env(env_id, 1, seed=0, evaluation=True, render_mode="rgb_array")
  except ConfigError:
    raise
  except Exception as e:  # gymnasium raises its own errors, or ImportError without pygame
    raise ConfigError("video", f"{env_id} cannot render rgb_array frames ({type(e).__name__}: {e})") from e
  try:
    one = env.envs[0]
    frame = one.render()
    if not (isinstance(frame, np.ndarray) and frame.ndim == 3 and frame.shape[-1] == 3):
      raise ConfigError("video", f"{env_id} renders {type(frame).__name__ if frame is None else frame.shape}, not "
                                 "rgb_array frames [H, W, 3] (does it take render_mode='rgb_array'?)")
    return int(one.metadata.get("render_fps") or 30)
  finally:
    env.close()


class Mp4Writer:
  """Streams RGB frames [H, W, 3] uint8 into an H.264 MP4 (yuv420p: plays in browsers and
  players). Written to a temporary sibling and renamed over `path` on success, so a failure
  leaves no partial file. Use as a context manager."""

  def __init__(self, path: str, fps: int):
    import imageio.v2 as imageio
    directory = os.path.dirname(os.path.abspath(path))
    fd, self._tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".mp4", dir=directory)
    os.close(fd)
    self.path, self.frames, self.size = path, 0, None
    try:
      # macro_block_size=2: keep the frame size (yuv420p needs even sides) instead of padding to 16.
      self._writer = imageio.get_writer(self._tmp, format="FFMPEG", mode="I", fps=fps, codec="libx264",
                                        pixelformat="yuv420p", macro_block_size=2, ffmpeg_log_level="error",
                                        output_params=["-movflags", "+faststart"])
    except BaseException:
      os.unlink(self._tmp)
      raise

  def append(self, frame: np.ndarray) -> None:
    """frame: [H, W, 3] uint8; every frame must have the size of the first."""
    frame = np.asarray(frame)
    if self.size is None:
      self.size = frame.shape[:2]
      with warnings.catch_warnings():  # the first frame starts ffmpeg: fork + exec at once, not JAX's concern
        warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
        self._writer.append_data(frame)
    else:
      self._writer.append_data(frame)
    self.frames += 1

  def __enter__(self) -> "Mp4Writer":
    return self

  def __exit__(self, error_type, error, traceback) -> None:
    try:
      self._writer.close()
      if error_type is None:
        if self.frames == 0:
          raise RuntimeError(f"no frames to write to {self.path}")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(self._tmp, 0o666 & ~umask)  # mkstemp made it private; a video is an ordinary file
        os.replace(self._tmp, self.path)
    finally:
      if os.path.exists(self._tmp):
        os.unlink(self._tmp)


class FrameRecorder(gym.Wrapper):
  """Sends the frames of this env's first stepped episode to `sink` ([H, W, 3] each), the
  reset frame included. A reset's frame is held until the episode takes a step, so resets
  that are never stepped (a vector env's construction reset, the autoreset after the
  episode) add nothing; steps after the episode's end add nothing either."""

  def __init__(self, env: gym.Env, sink: Callable[[np.ndarray], Any]):
    super().__init__(env)
    self._sink = sink
    self._pending = None
    self._done = False

  def reset(self, **kwargs):
    out = self.env.reset(**kwargs)
    if not self._done:
      self._pending = self.env.render()
    return out

  def step(self, action):
    out = self.env.step(action)
    if not self._done:
      if self._pending is not None:
        self._sink(self._pending)
        self._pending = None
      self._sink(self.env.render())
      self._done = bool(out[2] or out[3])
    return out


class VideoStats(NamedTuple):
  returns: List[float]  # per recorded episode
  frames: int
  height: int
  width: int
  fps: int
  bytes: int
  seconds: float


def record_episodes(path: str, env_id: str, policy, params, num_episodes: int, seed: int,
                    first_index: int = 0) -> VideoStats:
  """Writes to `path` (.mp4) the episodes of evaluation `first_index` of an Evaluator seeded
  `seed` with `num_episodes` envs, one after another: episode i replays env i (reset with
  seed + i + 1000 * first_index) in an evaluator of its own, so frames stream to the file in
  order. A greedy policy repeats the evaluation's returns exactly; a stochastic one draws anew.
  `policy`: the agent's evaluation PolicyFns."""
  from jrl.actors.evaluator import Evaluator

  start = time.monotonic()
  fps = check_renders(env_id)
  returns = []
  with Mp4Writer(path, fps) as writer:
    for i in range(num_episodes):
      record = lambda env: FrameRecorder(env, writer.append)
      evaluator = Evaluator(env_id, policy, 1, seed + i, first_index=first_index,
                            env_kwargs={"render_mode": "rgb_array", "wrappers": [record]})
      try:
        returns += evaluator.run(params)
      finally:
        evaluator.close()
  height, width = writer.size
  return VideoStats(returns, writer.frames, height, width, fps, os.path.getsize(path), time.monotonic() - start)
