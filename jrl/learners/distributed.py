"""Joining several learner processes into one JAX runtime (one mesh over all of them)."""

import jax


def initialize(coordinator_address: str, num_processes: int, process_id: int) -> None:
  """`jax.distributed.initialize`, with gloo collectives when the backend is the CPU.

  Call before any other JAX use in the process. Every process then sees the
  devices of all processes in `jax.devices()`.
  """
  if num_processes <= 1:
    return
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                             process_id=process_id)
