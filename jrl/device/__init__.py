"""The on-device form of a run (Podracer's "Anakin"): JAX-native envs (gymnax), the agent's
own policy and learner, and on-device replay inside one compiled `lax.scan` loop.

`jrl.gymnax_envs` (`jrl.device.envs`) adapts gymnax ids (`gymnax:ENV_ID`) and env factories of one's own,
`jrl.device.replay` holds the n-step and sequence windows and the replay ring buffer,
`jrl.device.loop` the compiled loop, and `jrl.device.runner.run_device` runs an experiment.
"""
