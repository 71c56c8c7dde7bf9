"""A lab probe (issue 18, goal 5): dev/tf32x3.py's tf32x3 against cuBLAS's fp32 (ieee),
one TF32 product and bf16, at the trainer's products for 0.5B shapes and 2,048 tokens a pass:
the time of a forward and its backward (both products) through autograd, each one's error
against float64 (the worst of y, dx, dw) and the memory it held above its inputs.
    python3 -m dev.gpu.tf32x3_bench [--tokens 2048]"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from dev.tf32x3 import linear, set_fp32_matmul

SHAPES = {  # name -> (in features, out features), Qwen2.5-0.5B
    "qkv": (896, 1152), "wo": (896, 896), "gate_up": (896, 9728), "down": (4864, 896),
    "head": (896, 151936)}
MODES = ("ieee", "tf32", "tf32x3", "bf16")


def pass_(x, w, gy, mode):
    """(y, dx, dw) of y = x w^T in `mode`."""
    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
    set_fp32_matmul("tf32x3" if mode == "tf32x3" else "ieee")
    torch.backends.cuda.matmul.fp32_precision = "tf32" if mode == "tf32" else "ieee"
    try:
        with torch.autocast("cuda", torch.bfloat16, enabled=mode == "bf16"):
            y = linear(x, w)
        dx, dw = torch.autograd.grad(y, (x, w), gy.to(y.dtype))
    finally:
        set_fp32_matmul("ieee")
        torch.backends.cuda.matmul.fp32_precision = "ieee"
    return y, dx, dw


def timed(fn, reps=20) -> float:
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2048)
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for name, (k, n) in SHAPES.items():
        x = torch.randn(args.tokens, k, device="cuda", generator=g)
        w = torch.randn(n, k, device="cuda", generator=g) * k ** -0.5
        gy = torch.randn(args.tokens, n, device="cuda", generator=g) * 1e-3
        x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
        y64 = F.linear(x64, w64)
        ref = (y64.detach(), *torch.autograd.grad(y64, (x64, w64), gy.double()))
        del x64, w64, y64
        row = {"product": name, "tokens": args.tokens, "in": k, "out": n}
        for mode in MODES:
            out = pass_(x, w, gy, mode)
            row[f"{mode}_rel_err"] = max(float((o.double() - r).norm() / r.norm()) for o, r in zip(out, ref))
            del out
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            pass_(x, w, gy, mode)
            row[f"{mode}_extra_mib"] = round((torch.cuda.max_memory_allocated() - base) / 2**20, 1)
            row[f"{mode}_ms"] = round(timed(lambda: pass_(x, w, gy, mode)), 4)
        del ref
        rows.append(row)
        print(json.dumps(row), flush=True)
    total = {m: round(sum(r[f"{m}_ms"] for r in rows), 3) for m in MODES}
    print("[tf32x3_bench] a layer's four products and the head, forward + backward, ms:",
          json.dumps(total), torch.cuda.get_device_name(), flush=True)


if __name__ == "__main__":
    main()
