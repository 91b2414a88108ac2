"""Replay layer. Only `jrl.replay.reverb_replay` imports reverb (and with it TensorFlow)."""
