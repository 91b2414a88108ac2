"""Ctrl-C (SIGINT) and SIGTERM during an in-process run: the run stops at its next safe point
and writes a checkpoint of itself there, so an interrupted run loses nothing.

A signal does not stop the run where it lands: an advance cut in the middle (an env step taken,
its learner calls not yet made; a device chunk's carry replaced, its counts not yet added) would
leave a state no checkpoint can hold. `Interrupts` only notes the signal; the run core's loop
looks between advances (`RunCore.drive`, the vmapped sweep's loop), checkpoints the state as of
the last whole advance and raises `RunInterrupted`. An advance is one env step and its learner
calls (embedded) or one compiled chunk (device), so the stop comes within one advance and the
checkpoint's write. The same signal again stops at once, as without this (KeyboardInterrupt where
it lands): Ctrl-C twice is the way out of a checkpoint that takes too long. The other signal after
the first changes nothing: Ctrl-C reaches every process of the terminal's group, and a parent
(launch.sweep, Launchpad's launcher) may then send its children SIGTERM as well.

The exit status is 128 + the signal's number, as a shell reports a process a signal ended:
130 for SIGINT, 143 for SIGTERM (`exit_status`).
"""

import signal
import threading
from typing import Optional

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def exit_status(signum: int) -> int:
  """The exit status of a run a signal interrupted: 130 (SIGINT), 143 (SIGTERM)."""
  return 128 + int(signum)


class RunInterrupted(KeyboardInterrupt):
  """The run stopped at a signal after checkpointing. `checkpoint`: the checkpoint it wrote (or
  found already written at those steps), None if its write failed; `env_steps`: where it stopped."""

  def __init__(self, signum: int, env_steps: int, checkpoint: Optional[str]):
    super().__init__(signal.Signals(signum).name)
    self.signum, self.env_steps, self.checkpoint = signum, env_steps, checkpoint


class Interrupts:
  """While entered (in the main thread), SIGINT and SIGTERM set `signum` instead of ending the
  run; the same signal a second time raises KeyboardInterrupt at once. Elsewhere (a run in another thread, where
  Python cannot take signals) it does nothing and `signum` stays None. The previous handlers come
  back on exit."""

  def __init__(self):
    self.signum: Optional[int] = None
    self._previous = {}

  def _handle(self, signum, frame) -> None:
    del frame
    if self.signum is None:
      self.signum = signum
    elif signum == self.signum:
      raise KeyboardInterrupt

  def __enter__(self) -> "Interrupts":
    if threading.current_thread() is threading.main_thread():
      for sig in SIGNALS:
        self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous = {}
