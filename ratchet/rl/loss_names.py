"""The names of the loss's pieces, for settings to validate without importing torch (the report
and the ablation tables' jobs read settings and never compute a loss). loss.py registers the
policy-loss variants under these names; tests/test_loss.py holds the two lists equal."""

ADVANTAGE_SCALES = ("std", "none")
IS_LEVELS = ("token", "sequence")
BUILTIN_POLICY_LOSSES = ("none", "tis", "mis")  # loss.POLICY_LOSSES' own; register_policy_loss adds more
