"""What a run's checkpoint holds of its replay, by name, inside its `replay/` folder (no imports: the
run directory's layer names them too, `jrl.experiment.files`)."""

REVERB_REPLAY_DIR = "reverb"       # a Reverb table's own checkpoint (a folder): embedded and Launchpad runs
SERVED_REPLAY = "served_buffer"    # a ReplayServer's data (served_buffer.json, .npz): programs without Reverb
