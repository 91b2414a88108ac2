"""The drivers of a run and the core they share: one home.

  jrl.run.core         the run core: one run's books, files and the loop every driver follows
  jrl.run.embedded     one process: Python envs, actor, replay and learner in turn
  jrl.run.device       one compiled loop on this host's devices (gymnax envs), and vmapped sweeps
  jrl.run.distributed  a Launchpad program: its nodes, program, multi-host plan and liveness

The drivers import the core, never one another (the import-linter contract of pyproject.toml).
"""
