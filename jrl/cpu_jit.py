"""How jrl runs its small per-step programs on XLA's CPU backend.

`jit_per_step`: jax.jit for the programs called once per env step (policies).

On XLA's CPU backend a small program pays more for how it is run than for its
arithmetic: DQN's CartPole policy (an MLP on 8 observations, epsilon-greedy) takes
~100 us per call under jax 0.6's default thunk runtime with Eigen's thread pool, and
~22 us compiled for the older whole-program runtime on one thread (same actions, bit for
bit; a Gaussian policy's float actions may differ in the last bit). Larger programs
(MinAtar's CNN on 8 observations, 2.7 MFLOP: 175 us by default, 241 us so) run faster
with the defaults, so the choice is made from the program's FLOPs, on the shapes of its
first call; it depends on nothing else, so runs stay reproducible. XLA versions without
an option simply do not get it (the newest have no legacy runtime, and gain nothing from
one thread).

`dispatch_synchronously` / `dispatch_asynchronously` / `choose_dispatch`: whether a jitted CPU
call runs in the calling thread or is handed to XLA's worker thread (set once per process,
before the first array). Processes start synchronous; `choose_dispatch` switches those whose
policies see images back to JAX's asynchronous default, where the actor's next policy call
overlaps its adder and inserts.
"""

import functools
import os
from typing import Any, Callable, Dict, Optional

import jax
import jax.numpy as jnp

ASYNC_DISPATCH_FLAG = "jax_cpu_enable_async_dispatch"  # JAX's switch, read when it makes its CPU client

# Up to this many FLOPs per call a program runs with SMALL_PROGRAM_OPTIONS (DQN's CartPole
# policy: 0.075 MFLOP on 8 envs, 100 -> 22 us; 0.6 MFLOP on 64, 92 -> 61 us).
SMALL_PROGRAM_FLOPS = 1e6
SMALL_PROGRAM_OPTIONS = (("xla_cpu_use_thunk_runtime", False), ("xla_cpu_multi_thread_eigen", False))


@functools.lru_cache(maxsize=None)
def small_program_options() -> Dict[str, Any]:
  """The options of SMALL_PROGRAM_OPTIONS this XLA knows (each probed on a tiny program)."""
  known = {}
  for name, value in SMALL_PROGRAM_OPTIONS:
    try:
      jax.jit(lambda x: x + 1, compiler_options={name: value})(jnp.zeros(()))
      known[name] = value
    except Exception:  # noqa: BLE001 - "No such compile option" (an XLA without it)
      pass
  return known


def program_flops(fn: Callable, *args: Any) -> Optional[float]:
  """XLA's count of the FLOPs of `fn(*args)` (arrays or jax.ShapeDtypeStruct), None where it has none."""
  try:
    cost = jax.jit(fn).lower(*args).cost_analysis()
  except Exception:  # noqa: BLE001 - no cost analysis
    return None
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return (cost or {}).get("flops")


def runs_on_platform(*args: Any) -> str:
  """The platform a jitted call on `args` runs on: that of its arrays committed to a device (a policy's
  parameters placed on the CPU of a GPU host: jrl.accelerators.actor_device), else JAX's default."""
  for leaf in jax.tree_util.tree_leaves(args):
    if isinstance(leaf, jax.Array) and getattr(leaf, "committed", False):
      return next(iter(leaf.devices())).platform
  return jax.default_backend()


def compiler_options_for(fn: Callable, *args: Any) -> Optional[Dict[str, Any]]:
  """SMALL_PROGRAM_OPTIONS when `fn(*args)` is a small program on the CPU, else None."""
  if runs_on_platform(*args) != "cpu":
    return None
  flops = program_flops(fn, *args)
  if flops is None or flops > SMALL_PROGRAM_FLOPS:
    return None
  return small_program_options() or None


class jit_per_step:  # noqa: N801 - used like jax.jit
  """`jax.jit(fn)`, compiled at the first call with the options `compiler_options_for` picks.

  Later calls with other shapes retrace as jax.jit does, keeping the first call's choice.
  `compiler_options` says what was picked (None: XLA's defaults)."""

  def __init__(self, fn: Callable):
    self._fn = fn
    self._jitted: Optional[Callable] = None
    self.compiler_options: Optional[Dict[str, Any]] = None

  def __call__(self, *args):
    if self._jitted is None:
      # A jax.jit with options rather than the lowered program compiled: its calls take jax.jit's
      # fast path (29 us a call against 37 us through `Lowered.compile()`, measured once), and the trace is shared.
      self.compiler_options = compiler_options_for(self._fn, *args)
      self._jitted = jax.jit(self._fn, compiler_options=self.compiler_options)
    return self._jitted(*args)


ASYNC_DISPATCH_ENV = "JRL_CPU_ASYNC_DISPATCH"


def dispatch_synchronously() -> bool:
  """Runs CPU programs in the calling thread instead of handing each to XLA's worker thread.

  Every jrl loop waits for its results at once (the actor for its actions, the learner for
  its metrics), so the handoff only adds a thread wake-up per call and, on a machine with
  few cores, a thread competing with the env and Reverb's threads. `make bench`, same
  machine, four alternating runs each: full actor 21.5-23.4k -> 24.0-25.7k env-steps/s; learner
  fed from Reverb at 4 updates/call 0.74, 0.75, 0.80, 0.92 -> 0.84-0.96 of the bare loop. Results are the same
  bytes. Call it before JAX makes its CPU client (the first array); later it changes nothing.
  Processes that join a multi-process mesh switch back (`jrl.learners.distributed.initialize`).
  $JRL_CPU_ASYNC_DISPATCH=1 keeps JAX's default. Returns whether dispatch is now synchronous."""
  if os.environ.get(ASYNC_DISPATCH_ENV) == "1":
    return False
  if _backends_made():
    return jax.config.values.get(ASYNC_DISPATCH_FLAG) is False  # too late to change it
  try:
    jax.config.update(ASYNC_DISPATCH_FLAG, False)
  except (AttributeError, KeyError):  # a JAX without the switch
    return False
  return True


def choose_dispatch(observation_shape) -> bool:
  """The dispatch for a process whose policy sees observations of `observation_shape`, chosen
  before its first array; returns whether dispatch is asynchronous.

  Image observations (rank 2 and up: a CNN, MinAtar's 2.7 MFLOP on 8 envs) get JAX's
  asynchronous dispatch, so that the actor asks for its next actions before its adder and
  inserts run (`Actor(dispatch_ahead=True)`) and XLA computes them meanwhile: MinAtar Breakout,
  8 envs, the actor alone with Reverb, 12.1-14.2k -> 14.7-16.4k env-steps/s in three alternating
  pairs of runs. Vector observations keep the synchronous dispatch of `dispatch_synchronously`
  (an MLP's 22 us has nothing worth overlapping). $JRL_CPU_ASYNC_DISPATCH=0 keeps images
  synchronous too; =1 makes every process asynchronous."""
  if len(observation_shape) >= 2 and os.environ.get(ASYNC_DISPATCH_ENV) != "0" and not _backends_made():
    dispatch_asynchronously()
  return dispatches_asynchronously()


def dispatch_asynchronously() -> None:
  """JAX's default back, for a process that joins a multi-process mesh (see
  `jrl.learners.distributed.initialize`); like `dispatch_synchronously`, before the first array."""
  jax.config.update(ASYNC_DISPATCH_FLAG, True)


def dispatches_asynchronously() -> bool:
  """Whether a jitted call returns before its result is computed (an accelerator, or the CPU
  with JAX's default), so that the caller can work meanwhile."""
  return jax.default_backend() != "cpu" or jax.config.values.get(ASYNC_DISPATCH_FLAG) is not False


def _backends_made() -> bool:
  try:
    from jax._src import xla_bridge  # no public query; the switch is read when the CPU client is made
    return bool(xla_bridge._backends)
  except (ImportError, AttributeError):
    return False
