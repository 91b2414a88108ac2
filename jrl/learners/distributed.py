"""Joining several learner processes into one JAX runtime (one mesh over all of them)."""

import jax

from jrl import cpu_jit


def initialize(coordinator_address: str, num_processes: int, process_id: int) -> None:
  """`jax.distributed.initialize`, with gloo collectives when the backend is the CPU.

  Call before any other JAX use in the process. Every process then sees the
  devices of all processes in `jax.devices()`.
  """
  if num_processes <= 1:
    return
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  # Processes of one mesh keep JAX's asynchronous CPU dispatch (`jrl.cpu_jit.dispatch_synchronously`
  # is for single-process loops): a two-process embedded run with synchronous dispatch once hung
  # after joining, on the 3.12 core (not reproduced in 3 runs), and these runs were only ever
  # tested asynchronous before.
  cpu_jit.dispatch_asynchronously()
  jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                             process_id=process_id)
