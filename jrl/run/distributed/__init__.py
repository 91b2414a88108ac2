"""The distributed driver: a Launchpad program of counter, replay, learners, inference servers,
actors and the driver node (`nodes`, `program`), placed on one host or several (`placement`,
`multihost`, `liveness`), with the faults the project's own tests inject (`faults`). Launching it
is `launch.distributed`'s and `launch.cluster`'s."""
