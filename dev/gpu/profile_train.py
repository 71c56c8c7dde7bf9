"""The train phase of one GRPO step on the local profile under torch.profiler: the top
operators by GPU time (a lab probe for issue 18; `python3 dev/gpu/profile_train.py bf16`)."""

import os
import sys
import tempfile
from pathlib import Path

import torch

from ratchet import config as config_mod
from ratchet.rl import colocated
from ratchet.stages.train import make_job

os.environ.setdefault("RATCHET_TRACKING", "off")
compute = sys.argv[1] if len(sys.argv) > 1 else "bf16"
cfg = config_mod.load("config/local.yaml", [])
calls = {"n": 0}
original = colocated.grpo_step


def profiled(*args, **kw):
    calls["n"] += 1
    if calls["n"] != 3:
        return original(*args, **kw)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        out = original(*args, **kw)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=60))
    return out


colocated.grpo_step = profiled
with tempfile.TemporaryDirectory() as tmp:
    job = make_job(cfg, "colocated", out_dir=Path(tmp), steps=3, eval_every=0, checkpoints=False,
                   save_model=False, resume=False, compute_dtype=compute)
    colocated.run_colocated(job)
