"""Host agent of a multi-host program: runs this host's nodes until the program stops.

  python -m launch.host RUN_DIR HOST

Started once per host (a Slurm step, or the template launcher's command). It
supervises the nodes the plan puts on HOST (restarts as configured), binds
their servers to the host's address, stops them when the stop file appears,
and on a node failure writes the report and the stop file so every host ends.
Exit status: 0 when every node ended cleanly, 1 after a failure. It writes a heartbeat
(`jrl.run.distributed.liveness`) for the launcher to see it alive; its nodes die with it.
"""

import os
import signal
import sys
import threading

from jrl import compat

compat.import_jax_probability()

from launch import loopback, supervisor  # noqa: E402
from jrl.run.distributed import liveness, multihost


def _watch(sup: supervisor.Supervisor, run_dir: str, host: str, done: threading.Event) -> None:
  """Stops this host's nodes once the program stops; spreads a local failure to every host."""
  stop_file = multihost.stop_path(run_dir)
  reported = False
  while not done.wait(0.2):
    if sup.failure is not None and not reported:
      reported = True
      with open(multihost.failure_path(run_dir, host), "w") as f:
        f.write(str(sup.failure) + "\n")
      multihost.RequestStop(stop_file)()
    if os.path.exists(stop_file) and not sup.stop_event().is_set():
      os.kill(os.getpid(), signal.SIGTERM)  # the supervisor stops its nodes from the main thread


def main(argv) -> int:
  if len(argv) != 2:
    print("usage: python -m launch.host RUN_DIR HOST", file=sys.stderr)
    return 2
  run_dir, host = os.path.abspath(argv[0]), argv[1]
  plan = multihost.read_plan(run_dir)
  if host not in plan["hosts"]:
    print(f"launch.host: host '{host}' is not in the plan ({', '.join(plan['hosts'])})", file=sys.stderr)
    return 2
  # A node's GPUs are numbered within those this agent was given (a Slurm step's CUDA_VISIBLE_DEVICES).
  commands = multihost.host_commands(plan, host, os.environ.get("CUDA_VISIBLE_DEVICES", ""))
  env = {**loopback.node_env(plan["hosts"][host]["address"]), "JRL_HOST": host}
  restart = plan["restart"]
  policy = supervisor.RestartPolicy(tuple(restart["groups"]), restart["max_restarts"], restart["backoff_seconds"])
  print(f"[host {host}] {len(commands)} nodes: {', '.join(c.title for c in commands)}", flush=True)
  heartbeat = liveness.Heartbeat(run_dir, host)  # the launcher's HostWatch notices when it stops
  heartbeat.start()
  sup = supervisor.Supervisor(commands, run_dir, policy, env)
  done = threading.Event()
  watcher = threading.Thread(target=_watch, args=(sup, run_dir, host, done), daemon=True)
  watcher.start()
  try:
    sup.wait()
  except supervisor.NodeFailure as failure:
    heartbeat.stop()
    done.set()
    watcher.join()
    if not os.path.exists(multihost.failure_path(run_dir, host)):
      with open(multihost.failure_path(run_dir, host), "w") as f:
        f.write(str(failure) + "\n")
      multihost.RequestStop(multihost.stop_path(run_dir))()
    print(f"[host {host}] {failure}", flush=True)
    return 1
  done.set()
  heartbeat.stop()
  print(f"[host {host}] all nodes ended", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
