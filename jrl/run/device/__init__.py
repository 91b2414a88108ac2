"""The on-device form of a run (Podracer's "Anakin"): JAX-native envs (gymnax), the agent's
own policy and learner, and on-device replay inside one compiled `lax.scan` loop.

`jrl.gymnax_envs` adapts gymnax ids (`gymnax:ENV_ID`) and env factories of one's own,
`jrl.replay.on_device` holds the n-step and sequence windows, the replay ring buffer and its gather,
`jrl.run.device.loop` the compiled loop, and `jrl.run.device.runner.run_device` runs an experiment.
"""
