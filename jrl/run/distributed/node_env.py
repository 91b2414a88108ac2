"""What a node process finds in its environment, set by the launcher that started it
(`launch.supervisor`, the Ray engine) and read by the node (`jrl.run.distributed.node_io`)."""

INCARNATION_ENV = "JRL_INCARNATION"  # 0 for a node's first process, n after its n-th restart
RUN_DIR_ENV = "JRL_RUN_DIR"  # in every node's environment: finds a run's processes
# Every engine's restarted nodes add a row here (under the run directory): time, node, exit code or
# signal, restart, delay (launch.supervisor's columns).
RESTARTS_FILE = "metrics/restarts.csv"
