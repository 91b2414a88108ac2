#!/usr/bin/env bash
# A real three-host Slurm cluster on one machine, for tests (root only).
#
#   scripts/slurm_test_cluster.sh up STATE_DIR     # network namespaces + munge + slurmctld + 3 slurmd
#   scripts/slurm_test_cluster.sh hosts STATE_DIR  # the three hosts' network namespaces alone (no Slurm):
#                                                  # a Ray cluster's test hosts (tests/test_ray_engine.py)
#   scripts/slurm_test_cluster.sh down STATE_DIR   # stops every daemon, removes namespaces and bridge
#
# Hosts node1..node3 are network namespaces slurmns1..3 at 10.200.0.1..3 on the
# bridge brslurm (10.200.0.254, where slurmctld listens), each with its own host
# name and a hosts file naming all three. They share this machine's filesystem
# otherwise, so a run directory is "on a shared filesystem".
# Needs Debian's slurm-wlm and munge (`apt-get install -y slurm-wlm munge`).
# After `up`, use the cluster with `SLURM_CONF=STATE_DIR/slurm.conf`.
set -euo pipefail

ACTION=${1:?usage: $0 up|down STATE_DIR}
D=$(realpath -m "${2:?usage: $0 up|down STATE_DIR}")
HOSTS=3

down() {
  export SLURM_CONF="$D/slurm.conf"
  if [ -f "$D/slurm.conf" ]; then scontrol shutdown >/dev/null 2>&1 || true; fi
  for _ in $(seq 1 100); do
    alive=0
    for pidfile in "$D"/*.pid; do
      [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null && alive=1
    done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for pidfile in "$D"/*.pid "$D"/munge/munged.pid; do
    [ -f "$pidfile" ] && kill -9 "$(cat "$pidfile")" 2>/dev/null || true
  done
  for i in $(seq 1 $HOSTS); do
    # What is left in a host (a step daemon whose slurmd was killed) goes with it.
    ip netns pids "slurmns$i" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "slurmns$i" 2>/dev/null || true
    ip link del "vslurm$i" 2>/dev/null || true
  done
  ip link del brslurm 2>/dev/null || true
}

# The hosts: namespaces slurmns1..3 at 10.200.0.1..3 on the bridge brslurm (10.200.0.254), and a hosts
# file naming them all ($D/hosts).
network() {
  ip link add brslurm type bridge
  ip addr add 10.200.0.254/24 dev brslurm
  ip link set brslurm up
  for i in $(seq 1 $HOSTS); do
    ip netns add "slurmns$i"
    ip link add "vslurm$i" type veth peer name eth0 netns "slurmns$i"
    ip link set "vslurm$i" master brslurm up
    ip -n "slurmns$i" addr add "10.200.0.$i/24" dev eth0
    ip -n "slurmns$i" link set eth0 up
    ip -n "slurmns$i" link set lo up
  done
  { echo "127.0.0.1 localhost"; for i in $(seq 1 $HOSTS); do echo "10.200.0.$i node$i"; done; } > "$D/hosts"
}

hosts() {
  for tool in ip nsenter; do
    command -v "$tool" >/dev/null || { echo "slurm_test_cluster: '$tool' not found (apt-get install -y iproute2)" >&2; exit 2; }
  done
  [ "$(id -u)" = 0 ] || { echo "slurm_test_cluster: needs root (network namespaces)" >&2; exit 2; }
  down  # leftovers of an earlier run
  mkdir -p "$D"
  network
  echo "slurm_test_cluster: $HOSTS hosts up (network namespaces slurmns1..$HOSTS at 10.200.0.1..$HOSTS)"
}

up() {
  for tool in slurmctld slurmd munged sinfo ip nsenter unshare; do
    command -v "$tool" >/dev/null || { echo "slurm_test_cluster: '$tool' not found (apt-get install -y slurm-wlm munge iproute2)" >&2; exit 2; }
  done
  [ "$(id -u)" = 0 ] || { echo "slurm_test_cluster: needs root (network namespaces)" >&2; exit 2; }
  down  # leftovers of an earlier run
  mkdir -p "$D"/state "$D"/log "$D"/munge
  chmod 711 "$D"  # munged checks that its socket's folders are searchable by all
  for i in $(seq 1 $HOSTS); do mkdir -p "$D/spool/node$i"; done
  chmod 711 "$D/munge"

  network

  head -c 128 /dev/urandom > "$D/munge/munge.key"
  chmod 400 "$D/munge/munge.key"
  munged --socket="$D/munge/munge.sock" --key-file="$D/munge/munge.key" --pid-file="$D/munge/munged.pid" \
    --log-file="$D/munge/munged.log" --seed-file="$D/munge/munged.seed"

  cat > "$D/slurm.conf" <<EOF
ClusterName=jrltest
SlurmctldHost=$(hostname -s)(10.200.0.254)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$D/munge/munge.sock
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool/%n
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd-%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SlurmdParameters=config_overrides
MailProg=/bin/true
# A cancelled job's steps get SIGKILL 5 s after SIGTERM (Slurm's default waits 30 s): the tests wait less.
KillWait=5
ReturnToService=2
NodeName=node[1-$HOSTS] NodeAddr=10.200.0.[1-$HOSTS] NodeHostname=node[1-$HOSTS] CPUs=4 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  export SLURM_CONF="$D/slurm.conf"
  slurmctld
  # Each host sees its own name and resolves every host's (gloo looks its own up): a
  # private hosts file, bind-mounted in a mount namespace of the host's own.
  for i in $(seq 1 $HOSTS); do
    nsenter --net="/run/netns/slurmns$i" unshare --uts --mount sh -c \
      "mount --bind $D/hosts /etc/hosts && hostname node$i && exec slurmd -N node$i"
  done
  for _ in $(seq 1 300); do
    if [ "$(sinfo -h -o '%T %D' 2>/dev/null)" = "idle $HOSTS" ]; then
      echo "slurm_test_cluster: $HOSTS hosts idle (SLURM_CONF=$D/slurm.conf)"
      return 0
    fi
    sleep 0.1
  done
  echo "slurm_test_cluster: hosts did not become idle; sinfo says: $(sinfo -h 2>&1)" >&2
  down
  exit 1
}

case "$ACTION" in
  up) up ;;
  hosts) hosts ;;
  down) down ;;
  *) echo "usage: $0 up|hosts|down STATE_DIR" >&2; exit 2 ;;
esac
