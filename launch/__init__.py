"""jrl's command-line tools (train, sweep, evaluate, report, advise, device_hosts, host) and its
launchers (`launch.distributed`: this host; `launch.cluster`: Slurm and command templates). The
drivers they start live in `jrl.run`."""

import jrl  # noqa: F401 - its finder serves the old paths of modules moved out of launch/ (jrl.MOVED_MODULES)
