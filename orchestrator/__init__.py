"""orch: deep-learning experiment sweeps on AWS spot GPUs or on this machine."""

__version__ = "0.1.0"
