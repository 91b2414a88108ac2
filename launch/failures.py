"""How a launcher names a node that failed, whichever engine ran it: the node, the cause, the
traceback its log holds."""

import signal
from typing import Optional

# When several nodes fail at once, the one that explains the others: services before their clients.
BLAME_ORDER = ("learner", "replay", "inference", "counter", "evaluator", "actor")


def describe_exit(returncode: int) -> str:
  if returncode < 0:
    try:
      return f"killed by {signal.Signals(-returncode).name}"
    except ValueError:
      return f"killed by signal {-returncode}"
  return f"exit code {returncode}"


def last_traceback(path: str, offset: int = 0, max_lines: int = 25) -> Optional[str]:
  """The last Python traceback written to `path` after byte `offset` (not counting
  the 'Exception ignored in' noise of interpreter shutdown)."""
  try:
    with open(path, "rb") as f:
      f.seek(offset)
      lines = f.read().decode(errors="replace").splitlines()
  except OSError:
    return None
  starts = [i for i, line in enumerate(lines) if line.startswith("Traceback")
            and not (i > 0 and lines[i - 1].startswith("Exception ignored in"))]
  if not starts:
    return None
  block = lines[starts[-1]:]
  end = next((i for i, line in enumerate(block) if not line.strip() or line.startswith("Exception ignored in")),
             len(block))
  return "\n".join(block[:end][-max_lines:])


class NodeFailure(RuntimeError):
  """A node failed and the program was stopped; the message is the report."""

  def __init__(self, node: str, cause: str, log_path: str, traceback: Optional[str],
               restarts: Optional[int] = None):
    self.node, self.cause, self.log_path, self.restarts = node, cause, log_path, restarts
    after = f" after {restarts} restart{'s' if restarts != 1 else ''} (max_restarts)" if restarts is not None else ""
    detail = f":\n{traceback}" if traceback else f"; no traceback in its log {log_path}"
    super().__init__(f"node {node} failed ({cause}){after}{detail}")
