"""How many operators the trainer dispatches for one micro-batch's forward and backward, by
name: on the GPU its train phase is bound by the host (dev/gpu/profile_train.py), so a count
measured on a CPU says what a change saves there. A model of 0.5B's depth (24 layers) and
small widths: the count depends on the layers, not the sizes.

    python -m dev.trainer_ops --weight-dtype fp16 --out ops.json
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

import torch

from ratchet.atomic import write_text
from ratchet.model.config import ModelConfig
from ratchet.trainer.policy import Policy

# operators that launch nothing: views, metadata, allocation
NO_KERNEL = {"aten::as_strided", "aten::view", "aten::transpose", "aten::t", "aten::slice", "aten::narrow",
             "aten::reshape", "aten::_reshape_alias", "aten::expand", "aten::unsqueeze", "aten::squeeze",
             "aten::detach", "aten::alias", "aten::resolve_conj", "aten::resolve_neg", "aten::empty",
             "aten::empty_strided", "aten::empty_like", "aten::select", "aten::split", "aten::split_with_sizes",
             "aten::chunk", "aten::permute", "aten::view_as", "aten::lift_fresh", "aten::unbind",
             "aten::to", "aten::_unsafe_view", "aten::contiguous", "aten::matmul", "aten::linear"}


def count(weight_dtype: str, micro_batches: int = 2, layers: int = 24) -> dict:
    torch.manual_seed(0)
    cfg = ModelConfig(arch="qwen2", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=layers,
                      num_heads=4, num_kv_heads=2, head_dim=16, tie_word_embeddings=True, qkv_bias=True)
    policy = Policy(cfg)
    prompts = [[1, 2, 3, 4]] * 8
    responses = [[5 + i, 6, 7, 8, 9][: 2 + i % 4] for i in range(8)]

    def micro_batch():
        lp, mask, _ = policy.token_logprobs(prompts, responses, weight_dtype=weight_dtype)
        lp[mask].sum().backward()

    micro_batch()  # warm: lazily built tables, the first call's caches
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(micro_batches):
            micro_batch()
    names = collections.Counter(e.name for e in prof.events() if e.name.startswith("aten::"))
    kernels = {k: v for k, v in names.items() if k not in NO_KERNEL}
    per = lambda n: round(n / micro_batches, 1)
    return {"weight_dtype": weight_dtype, "layers": layers, "micro_batch": len(prompts),
            "aten_calls_per_micro_batch": per(sum(names.values())),
            "computing_calls_per_micro_batch": per(sum(kernels.values())),
            "top_computing": {k: per(v) for k, v in sorted(kernels.items(), key=lambda kv: -kv[1])[:12]}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weight-dtype", action="append", default=None, choices=["fp32", "fp16", "bf16"])
    ap.add_argument("--out")
    args = ap.parse_args()
    rows = [count(d) for d in (args.weight_dtype or ["fp32", "fp16"])]
    text = json.dumps(rows, indent=1)
    print(text)
    if args.out:
        write_text(Path(args.out), text + "\n")


if __name__ == "__main__":
    main()
