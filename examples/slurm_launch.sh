#!/usr/bin/env bash
# A distributed DQN program across three Slurm hosts: replay, learner, counter and evaluator on
# the first, a central inference server on the second, actors on the second and third.
#
#   bash examples/slurm_launch.sh [RUN_DIR] [any launch.train flag ...]
#
# Run it on the Slurm login host, from the repository root of a checkout that every host sees at
# the same path (a shared filesystem), after `make setup`. jrl writes RUN_DIR/launch/job.sbatch
# (one job, one step per host), submits it and follows it; Ctrl-C cancels the job. Try it on one
# machine with the project's test cluster: `sudo scripts/slurm_test_cluster.sh up /tmp/jrl-slurm`
# and `export SLURM_CONF=/tmp/jrl-slurm/slurm.conf`.
set -euo pipefail
RUN_DIR="${1:-runs/slurm-dqn}"
shift || true
exec .venv/bin/python -m launch.train --agent dqn --env CartPole-v1 --distributed --launcher slurm \
  --hosts node1,node2,node3 \
  --placement "replay,learner,counter,evaluator=node1 inference=node2 actor=node2,node3" \
  --num_actors 4 --inference server --steps 100000 --run_dir "$RUN_DIR" "$@"
