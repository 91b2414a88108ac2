"""Policies of finished runs, for use outside jrl's runs: `jrl.load_policy(run_dir)` and the
snapshot files behind it. They live in the run core, `jrl.experiment.snapshots` (runs save them
there); this module is their public name.

  policy = jrl.load_policy("runs/dqn-s0")   # greedy policy of the best snapshot
  actions = policy(observations)            # [B, *obs_shape] -> [B, *action_shape], numpy
"""

from jrl.experiment.snapshots import (  # noqa: F401
    SNAPSHOTS, Policy, Snapshot, load_config, load_params, load_policy, load_snapshot, read_policy_info,
    save_policy, saved_snapshots, snapshot_paths)
