"""How much of the engine-trainer gap is left when the trainer rounds its activations where
the engine stores them (`storage_dtype`, precision.engine_storage), on CPU: the NumPy fp16
engine against the trainer on the same fp16 weights, fp32 arithmetic, without and with the
engine's storage rounding, for the model cut to its first L layers (last-position logits of
one 60-token prompt), and optionally on sampled rollouts of the whole model.

    PYTHONPATH=. python3 tools/cpu/storage_match.py MODEL.gguf [--layers 1 2 4 24] [--rollouts 4 24]

Why it matters: matching the rounding points leaves only the fp32 summation order apart, but
rounding is discontinuous: one activation that rounds the other way is a full fp16 step, and
from there on the two forwards round independently (docs/KERNELS.md, mismatch section).
"""

from __future__ import annotations

import argparse
import dataclasses
from types import SimpleNamespace

import numpy as np
import torch

from ratchet.engine.engine import Engine
from ratchet.engine.numpy.backend import NumpyBackend
from ratchet.engine.request import Request
from ratchet.model.convert_gguf import convert_gguf
from ratchet.model.dtypes import round_to
from ratchet.trainer.policy import Policy
from ratchet.trainer.precision import engine_storage


def truncated(cfg, weights, layers: int):
    c = dataclasses.replace(cfg, num_layers=layers)
    keep = {k: v for k, v in weights.items() if not k.startswith("layers.") or int(k.split(".")[1]) < layers}
    return c, keep


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("--layers", type=int, nargs="*", default=[1, 2, 4])
    ap.add_argument("--rollouts", type=int, nargs=2, metavar=("B", "NEW"))
    args = ap.parse_args()
    torch.set_num_threads(2)
    cfg, weights = convert_gguf(args.gguf, "/tmp/ratchet-storage-match-tokenizer")
    weights = {k: round_to(v, "fp16") for k, v in weights.items()}
    toks = np.random.default_rng(0).integers(0, 20000, 60).tolist()
    for layers in args.layers:
        c, w = truncated(cfg, weights, layers)
        engine = NumpyBackend(c, "fp16", 1, 256)
        engine.load_weights(w)
        want = engine.prefill(0, toks, 0)
        policy = Policy.from_weights(c, w)
        with torch.no_grad():
            for storage in ("fp32", "fp16"):
                with engine_storage(storage):
                    got = policy.logits(torch.tensor([toks]))[0, -1].numpy()
                d = np.abs(got - want)
                print(f"{layers:3d} layers, trainer storage {storage}: |d logit| max {d.max():.3e}, "
                      f"mean {d.mean():.3e}, logits bit-equal {np.mean(got == want):.3f}", flush=True)
    if args.rollouts:
        b, new = args.rollouts
        rng = np.random.default_rng(1)
        prompts = [rng.integers(0, 20000, 40).tolist() for _ in range(b)]
        model = SimpleNamespace(cfg=cfg, weights=weights, dtype="fp16")
        reqs = Engine(model, max_batch_size=b, max_seq_len=256, eos_ids=[]).generate(
            [Request(i, p, new, seed=1) for i, p in enumerate(prompts)])
        engine_lp = np.concatenate([np.asarray(r.logprobs, np.float32) for r in reqs])
        policy = Policy.from_weights(cfg, weights)
        with torch.no_grad():
            for storage in ("fp32", "fp16"):
                lp, mask, _ = policy.token_logprobs(prompts, [r.output for r in reqs], weight_dtype="fp16",
                                                    storage_dtype=storage)
                d = np.abs(lp[mask].numpy() - engine_lp)
                print(f"rollouts ({d.size} tokens, {cfg.num_layers} layers), trainer storage {storage}: "
                      f"|d logp| max {d.max():.3e}, p99 {np.percentile(d, 99):.3e}, mean {d.mean():.3e}", flush=True)


if __name__ == "__main__":
    main()
