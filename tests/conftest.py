# TFP 0.25 (via rlax/distrax) refuses TF 2.8 once TensorFlow is loaded; tests that
# import reverb run in the same process, so load these first.
import distrax  # noqa: F401
import rlax  # noqa: F401
