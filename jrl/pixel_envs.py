"""Pixel envs: Atari through ale-py and MinAtar, with documented preprocessing presets.

An env id picks its preset: `ALE/...` ids get `atari`, `MinAtar/...` ids get `minatar`; a
suffix names another one (`ALE/Pong-v5@none` is the raw ALE env). Presets:

- `atari`: the standard DQN preprocessing (Mnih et al., 2015; Machado et al., 2018): the ALE
  env with frameskip 1 and its own sticky actions (v5: 0.25), up to 30 no-op steps at reset,
  each action repeated 4 frames with the max over the last two, 84x84 grayscale, the last 4
  frames stacked channels-last: observations (84, 84, 4) uint8. In training a lost life ends
  the episode (terminated, so no bootstrap) and the next reset continues the same game with a
  no-op step; evaluation plays whole games. Games with a FIRE action press it to start play
  (`FireReset`): at every reset, so in training after every lost life, and in evaluation after a
  lost life too (a policy trained so never learns to press FIRE itself). Rewards are not clipped
  here: that is the agents' `reward_clip` option, so evaluation returns are game scores. An episode ends (truncated) at
  ALE v5's 108,000 frames, 27,000 agent steps (`episode_step_cap`).
- `minatar`: the MinAtar env as the `minatar` package registers it ((10, 10, C) bool object
  planes, channels last; its own sticky actions, 0.1), truncated at 10,000 steps (MinAtar has
  no time limit, and a greedy policy that keeps the ball would never end an evaluation).
- `none`: `gymnasium.make(id)` as it is.

ROMs come from ale-py's wheel; nothing is downloaded.
"""

import functools
from typing import Optional, Tuple

import gymnasium as gym
import numpy as np

from jrl.errors import ConfigError

PRESETS = ("atari", "minatar", "none")
MINATAR_MAX_STEPS = 10_000
FRAME_STACK = 4
FRAME_SKIP = 4
# ALE v5's own episode limit (max_num_frames_per_episode), as Machado et al. (2018) and Dopamine
# cap an episode: 30 minutes of play at 60 frames a second.
ATARI_MAX_EPISODE_FRAMES = 108_000
ATARI_MAX_EPISODE_STEPS = ATARI_MAX_EPISODE_FRAMES // FRAME_SKIP  # 27,000 agent steps


def split_preset(env_id: str) -> Tuple[str, Optional[str]]:
  """(gymnasium id, preset) of `ID[@preset]`; the preset is None for ids without one that
  need no preprocessing. ConfigError("env") for an unknown preset."""
  base, sep, preset = env_id.partition("@")
  if sep:
    if preset not in PRESETS:
      raise ConfigError("env", f"unknown preset '{preset}' in '{env_id}' (presets: {', '.join(PRESETS)})")
    if preset == "atari" and not base.startswith("ALE/"):
      raise ConfigError("env", f"the atari preset takes ALE/... ids, got '{base}'")
    return base, None if preset == "none" else preset
  if base.startswith("ALE/"):
    return base, "atari"
  if base.startswith("MinAtar/"):
    return base, "minatar"
  return base, None


def frame_stack(env_id) -> int:
  """Frames stacked on the last axis of the env's observations by its preset (`atari`: 4), else 0:
  replay then stores each frame once (`jrl.replay.spec.ReplaySpec.frame_stack`)."""
  if not isinstance(env_id, str):
    return 0
  return FRAME_STACK if split_preset(env_id)[1] == "atari" else 0


def episode_step_cap(env_id) -> Optional[int]:
  """The most agent steps an episode of `env_id` lasts under its preset (`atari`: 27,000), the cap
  an evaluation holds every episode to; None where the env's own time limit is the only one."""
  if not isinstance(env_id, str):
    return None
  return ATARI_MAX_EPISODE_STEPS if split_preset(env_id)[1] == "atari" else None


def register(env_id: str) -> None:
  """Registers ALE's or MinAtar's gymnasium ids when `env_id` is one of them (idempotent)."""
  if env_id.startswith("ALE/"):
    try:
      import ale_py
    except ImportError as e:
      raise ConfigError("env", f"'{env_id}' needs ale-py (pip install ale-py==0.12.1)") from e
    gym.register_envs(ale_py)
  elif env_id.startswith("MinAtar/") and env_id not in gym.registry:
    try:
      import minatar.gym
    except ImportError as e:
      raise ConfigError("env", f"'{env_id}' needs MinAtar (pip install MinAtar==1.0.15)") from e
    minatar.gym.register_envs()


class EpisodicLife(gym.Wrapper):
  """A lost life terminates the episode; the following reset continues the game with one
  no-op step unless the game itself was over (then a real reset)."""

  def __init__(self, env: gym.Env):
    super().__init__(env)
    self._lives = 0
    self._game_over = True

  def step(self, action):
    obs, reward, terminated, truncated, info = self.env.step(action)
    self._game_over = terminated or truncated
    lives = self.env.unwrapped.ale.lives()
    if 0 < lives < self._lives:
      terminated = True
    self._lives = lives
    return obs, reward, terminated, truncated, info

  def reset(self, **kwargs):
    if self._game_over or kwargs.get("seed") is not None:
      obs, info = self.env.reset(**kwargs)
    else:
      obs, _, terminated, truncated, info = self.env.step(0)
      if terminated or truncated:
        obs, info = self.env.reset(**kwargs)
    self._game_over = False
    self._lives = self.env.unwrapped.ale.lives()
    return obs, info


FIRE_STEPS = (1, 2)  # FIRE, then action 2, as OpenAI Baselines' FireResetEnv


class FireReset(gym.Wrapper):
  """Presses FIRE (then action 2) after every reset, for games that wait for FIRE to start play
  (Breakout launches no ball without it: a policy that never presses FIRE plays to the episode
  cap). As OpenAI Baselines' FireResetEnv, which SB3 and CleanRL use: the two steps' rewards are
  dropped, and a step that ends the episode resets again.

  `after_lost_life`: FIRE also after a step that loses a life and not the game (evaluation's whole
  games; in training a lost life ends the episode and its reset presses FIRE), the two steps'
  rewards added to that step's: evaluation plays as training did, as CleanRL's evaluations do."""

  def __init__(self, env: gym.Env, after_lost_life: bool = False):
    super().__init__(env)
    meanings = env.unwrapped.get_action_meanings()
    if meanings[1:2] != ["FIRE"] or len(meanings) < 3:
      raise ValueError(f"FireReset needs action 1 to be FIRE and 3 actions or more, got {meanings}")
    self._after_lost_life = after_lost_life
    self._lives = 0

  def reset(self, **kwargs):
    self.env.reset(**kwargs)
    for action in FIRE_STEPS:
      obs, _, terminated, truncated, info = self.env.step(action)
      if terminated or truncated:
        obs, info = self.env.reset(**kwargs)
    self._lives = self.env.unwrapped.ale.lives()
    return obs, info

  def step(self, action):
    obs, reward, terminated, truncated, info = self.env.step(action)
    if not self._after_lost_life:  # training: a lost life ends the episode, and its reset presses FIRE
      return obs, reward, terminated, truncated, info
    lives = self.env.unwrapped.ale.lives()
    if lives < self._lives:
      for fire in FIRE_STEPS:
        if terminated or truncated:
          break
        obs, more, terminated, truncated, info = self.env.step(fire)
        reward += more
      lives = self.env.unwrapped.ale.lives()
    self._lives = lives
    return obs, reward, terminated, truncated, info


def needs_fire(env: gym.Env) -> bool:
  """Whether an ALE game has a FIRE action (the games FireReset is for, as SB3 picks them)."""
  return "FIRE" in env.unwrapped.get_action_meanings()


class ChannelsLast(gym.ObservationWrapper):
  """Stacked frames (k, H, W) -> (H, W, k), the layout of the image torsos."""

  def __init__(self, env: gym.Env):
    super().__init__(env)
    space = env.observation_space
    self.observation_space = gym.spaces.Box(np.moveaxis(space.low, 0, -1), np.moveaxis(space.high, 0, -1),
                                            dtype=space.dtype)

  def observation(self, observation):
    return np.ascontiguousarray(np.moveaxis(observation, 0, -1))


def make_env(env_id: str, preset: Optional[str], evaluation: bool = False, **make_kwargs) -> gym.Env:
  """One env `env_id` with `preset` (see the module docstring); `evaluation` plays whole games.
  `make_kwargs` go to `gymnasium.make` (e.g. render_mode)."""
  register(env_id)
  if preset == "atari":
    env = gym.make(env_id, frameskip=1, **make_kwargs)
    env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=FRAME_SKIP, screen_size=84,
                                          grayscale_obs=True)
    if not evaluation:
      env = EpisodicLife(env)
    if needs_fire(env):  # outside EpisodicLife: in training a lost life's reset presses it
      env = FireReset(env, after_lost_life=evaluation)
    return ChannelsLast(gym.wrappers.FrameStackObservation(env, FRAME_STACK))
  if preset == "minatar":
    return gym.wrappers.TimeLimit(gym.make(env_id, **make_kwargs), MINATAR_MAX_STEPS)
  return gym.make(env_id, **make_kwargs)


def factory(env_id: str, evaluation: bool = False):
  """A zero-argument env factory for `ID[@preset]` when it needs one (a preset or registration),
  else None (a plain gymnasium id)."""
  base, preset = split_preset(env_id)
  if preset is None and base == env_id and not base.startswith(("ALE/", "MinAtar/")):
    return None
  register(base)
  return functools.partial(make_env, base, preset, evaluation)
