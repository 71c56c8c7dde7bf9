"""ratchet: see and fix the training-inference mismatch in RL post-training."""

__version__ = "0.1.0"
