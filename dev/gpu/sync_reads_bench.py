"""The ablations' two per-tensor reads, before and after they were summed on the GPU (thirty-third
session): compare_gradients and visibility's count over the 0.5B's 290 parameter shapes,
random values, median wall of 5 after a warm-up, alone on the GPU.

    python3 dev/gpu/sync_reads_bench.py
"""

from __future__ import annotations

import json
import math
import statistics
import time

import torch

from ratchet.mismatch.gradient import compare_gradients
from ratchet.mismatch.visibility import changed_share
from ratchet.model.config import ModelConfig
from ratchet.model.layout import expected_shapes


def compare_before(grads, ref):  # 8b0e729^'s compare_gradients: four reads a parameter
    dot = sq = ref_sq = diff_sq = 0.0
    for g, r in zip(grads, ref):
        g64, r64 = g.double().flatten(), r.double().flatten()
        dot += float(torch.dot(g64, r64))
        sq += float(torch.dot(g64, g64))
        ref_sq += float(torch.dot(r64, r64))
        diff_sq += float(torch.sum(g64.sub_(r64).pow_(2)))
    return dot, sq, ref_sq, diff_sq


def changed_before(before, after, dtype):  # 8b0e729^'s count: a read a tensor
    t = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    hits = total = 0
    for name, w in after.items():
        hits += int(torch.count_nonzero(w.to(t).float() != before[name].to(t).float()))
        total += w.numel()
    return hits / total


def timed(fn, *args):
    fn(*args)
    torch.cuda.synchronize()
    walls = []
    for _ in range(5):
        t0 = time.perf_counter()
        fn(*args)
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - t0)
    return statistics.median(walls) * 1e3


def main() -> None:
    cfg = ModelConfig(arch="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864, num_layers=24,
                      num_heads=14, num_kv_heads=2, head_dim=64, qkv_bias=True, tie_word_embeddings=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    shapes = expected_shapes(cfg)
    a = {k: torch.randn(s, device="cuda", generator=gen) * 0.02 for k, s in shapes.items()}
    b = {k: v + 1e-6 * torch.randn(v.shape, device="cuda", generator=gen) for k, v in a.items()}
    ga, gb = list(a.values()), list(b.values())
    new = compare_gradients(ga, gb)
    old = compare_before(ga, gb)
    out = {"device": torch.cuda.get_device_name(), "tensors": len(shapes),
           "compare_gradients_ms": {"before": timed(compare_before, ga, gb), "after": timed(compare_gradients, ga, gb)},
           "changed_share_ms": {"before": timed(changed_before, a, b, "fp16"), "after": timed(changed_share, a, b, "fp16")},
           "same_values": new["norm"] == math.sqrt(old[1]) and changed_before(a, b, "fp16") == changed_share(a, b, "fp16")}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
