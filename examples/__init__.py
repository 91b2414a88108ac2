"""Runnable examples of jrl as a library: `python -m examples.<name> --help` (from the repo root)."""
