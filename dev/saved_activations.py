"""What one trainer pass saves for its backward, with and without train.gradient_checkpointing,
counted on the CPU: where a GPU rule's memory goes before a GPU is lent. The trainer's own
forward (Policy.token_logprobs, the same autocast) runs on zero weights at the real model's
shapes but with one and two layers and two token counts; the tensors autograd saves are summed
(each storage once, the parameters left out) and the count is fitted as
a + b * tokens + layers * (c + d * tokens), exact for a forward whose every tensor grows
linearly in the tokens (the causal attention's kernels save no [T, T] scores). It counts what
is saved, not the allocator's peak (the backward's transients, the cache's fragmentation):
a planning figure that a GPU probe confirms (dev/gpu/train-probe.sh).

    python -m dev.saved_activations --gguf .cache/real/qwen2.5-coder-1.5b-instruct.gguf \\
        --tokens 8192 --compute-dtype fp16
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from pathlib import Path

import torch

PROBE_TOKENS = (256, 512)  # each a multiple of PROBE_ROWS
PROBE_ROWS = 4
PROMPT_TOKENS = 32


def saved_bytes(cfg, tokens: int, compute_dtype: str, checkpointing: bool) -> int:
    """Bytes autograd keeps for the backward of one token_logprobs pass over `tokens` tokens
    (PROBE_ROWS rows of PROMPT_TOKENS prompt tokens and the rest answer), parameters excluded."""
    from ratchet.trainer.policy import Policy

    with torch.device("meta"):
        policy = Policy(cfg)
    policy.to_empty(device="cpu")
    with torch.no_grad():  # the values change no size: zeros are the cheapest to make
        for p in policy.parameters():
            p.zero_()
    params = {p.untyped_storage().data_ptr() for p in policy.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    answer = tokens // PROBE_ROWS - PROMPT_TOKENS
    prompts = [[1] * PROMPT_TOKENS] * PROBE_ROWS
    responses = [[2] * answer] * PROBE_ROWS
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        # causal, as the profiles train: a mask's [B, T, T] would not grow linearly in the tokens
        policy.token_logprobs(prompts, responses, compute_dtype=compute_dtype, attention="causal",
                              gradient_checkpointing=checkpointing)
    return sum(seen.values())


def fit(cfg, compute_dtype: str, checkpointing: bool) -> dict[str, float]:
    """The linear model's coefficients (bytes): fixed, per token, per layer, per layer and token."""
    t1, t2 = PROBE_TOKENS
    counts = {(layers, t): saved_bytes(dataclasses.replace(cfg, num_layers=layers), t, compute_dtype,
                                       checkpointing)
              for layers in (1, 2) for t in (t1, t2)}
    layer = {t: counts[(2, t)] - counts[(1, t)] for t in (t1, t2)}
    rest = {t: counts[(1, t)] - layer[t] for t in (t1, t2)}
    per_token = lambda d: (d[t2] - d[t1]) / (t2 - t1)  # noqa: E731
    return {"fixed": rest[t1] - per_token(rest) * t1, "per_token": per_token(rest),
            "per_layer": layer[t1] - per_token(layer) * t1, "per_layer_token": per_token(layer)}


def predict(coef: dict[str, float], layers: int, tokens: int) -> float:
    return coef["fixed"] + coef["per_token"] * tokens + layers * (coef["per_layer"] + coef["per_layer_token"] * tokens)


def main(argv=None) -> None:
    from ratchet.model.convert_gguf import read_gguf_config
    from ratchet.model.gguf_file import read_gguf
    from ratchet.model.io import load_engine_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--gguf", type=Path, help="a GGUF file: its shapes (no tensor is read)")
    src.add_argument("--model", type=Path, help="a converted model folder (results/<run>/model)")
    ap.add_argument("--tokens", type=int, nargs="+", default=[2048, 8192], help="padded tokens a pass")
    ap.add_argument("--compute-dtype", default="fp16", choices=("fp32", "fp16", "bf16"))
    args = ap.parse_args(argv)
    with contextlib.redirect_stdout(sys.stderr):  # the loader's "reading ..." lines: stdout is the JSON
        cfg = read_gguf_config(read_gguf(args.gguf), args.gguf) if args.gguf else load_engine_model(args.model).cfg
    gib = 2.0 ** 30
    out = {"layers": cfg.num_layers, "hidden": cfg.hidden_size, "compute_dtype": args.compute_dtype,
           "saved_gib": {}}
    coefs = {ckpt: fit(cfg, args.compute_dtype, ckpt) for ckpt in (False, True)}
    for tokens in args.tokens:
        plain, ckpt = (predict(coefs[c], cfg.num_layers, tokens) / gib for c in (False, True))
        # the checkpointed backward recomputes one layer at a time: its saved tensors come back
        layer = (coefs[False]["per_layer"] + coefs[False]["per_layer_token"] * tokens) / gib
        out["saved_gib"][tokens] = {"plain": plain, "checkpointed": ckpt,
                                    "checkpointed_with_one_layer_recomputed": ckpt + layer,
                                    "saving": plain - ckpt - layer}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
