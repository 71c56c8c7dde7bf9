"""torch._dynamo imported with the cycle its import leaves collected at once. torch imports it
lazily from inside calls (use_deterministic_algorithms, Embedding's init even on the meta
device, AdamW's constructor), and its import leaves the calling frames in a reference cycle
(torch.fx's `wrap` holds its own frame), their locals with them: an ablation's first run (its
masters, AdamW moments and engines, tens of GiB at 1.5B) outlived the run until the collector's
next full pass. Called before those calls."""

from __future__ import annotations

import gc
import sys


def import_dynamo() -> None:
    if "torch._dynamo" not in sys.modules:
        import torch._dynamo  # noqa: F401

        gc.collect()
