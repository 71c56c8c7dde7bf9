"""The train phase of one GRPO step on the local profile under torch.profiler: the top
operators by GPU time (a lab probe for issue 18):
    python3 dev/gpu/profile_train.py fp16 train.micro_batch_size=64 train.attention=causal
(the trainer's compute dtype, then any config overrides)."""

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
cfg = config_mod.load("config/local.yaml", sys.argv[2:])
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
    events = prof.key_averages()
    print(events.table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=60))
    gpu_us = sum(e.self_device_time_total for e in events)
    cpu_us = sum(e.self_cpu_time_total for e in events)
    print(f"[profile_train] {compute} {' '.join(sys.argv[2:])}: self GPU {gpu_us / 1e6:.3f} s, "
          f"self CPU {cpu_us / 1e6:.3f} s", flush=True)
    return out


colocated.grpo_step = profiled
with tempfile.TemporaryDirectory() as tmp:
    job = make_job(cfg, "colocated", out_dir=Path(tmp), steps=3, eval_every=0, checkpoints=False,
                   save_model=False, resume=False, compute_dtype=compute)
    colocated.run_colocated(job)
