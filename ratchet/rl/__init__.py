"""GRPO: the colocated and split training loops, the one GRPO step, rollouts, sync, checkpoints."""

MODES = ("colocated", "split")  # the two ways of running engine and trainer
