"""The gymnax envs of the device backend: `jrl.gymnax_envs` (the envs layer, so that the run core
can describe a gymnax env without importing the device loop); its names, kept here."""

from jrl.gymnax_envs import (  # noqa: F401
    PREFIX, GymnaxVecEnv, StepResult, check_device_env_id, env_spec, gymnax_name, is_gymnax_id, make_gymnax_env,
    reward_threshold)
