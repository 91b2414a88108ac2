"""What a distributed program's nodes need from the engine that runs them, and nothing more.

The nodes (`counter`, `learner_node`, `actor_node`, `inference_node`, `driver_node`) are plain
classes: an engine builds each in a process of its own, serves its public methods to the other nodes,
and calls its `run()`. Launchpad does it with courier (`launchpad_engine`, the full stack), Ray
with its actors (`ray_engine`, either stack). A node reaches another through a `Handle` the engine
made from what it was given (a courier client, a Ray actor handle), and the replay through a
`jrl.replay.service.ReplayClient`; it learns that the program is stopping from the engine's stop event.

  counts = wait_unless_stopped(counter.future("get_counts"), stop)   # jrl.run.distributed.rpc
  version = learner.call("version")
"""

import concurrent.futures
import threading
from typing import Any, Protocol


class Handle(Protocol):
  """Another node, as this node calls it: its public methods by name."""

  @property
  def address(self) -> str:
    """Where the node is served, for messages ('localhost:43123', a Ray actor's name)."""

  def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
    """Calls `method` and waits for its result (its error raised here)."""

  def future(self, method: str, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
    """Calls `method` and returns at once; the future has its result or error."""


class Engine(Protocol):
  """An engine's services to the nodes it runs. Picklable: each node gets it as an argument."""

  name: str  # 'launchpad' or 'ray': the summary's `engine`

  def handle(self, raw: Any) -> Handle:
    """The handle of a node from what the engine passed this node for it."""

  def replay(self, raw: Any) -> Any:
    """The replay's `ReplayClient` from what the engine passed for it (a Reverb client, a handle of
    jrl's replay server)."""

  def stop_event(self) -> threading.Event:
    """Set once the program stops; asked from the node's own thread."""

  def stop(self) -> None:
    """Stops the program (its driver node, at the run's end)."""

  def wait_for_stop(self) -> None:
    """Returns once the program stops (a node that has finished its work but must stay served)."""
