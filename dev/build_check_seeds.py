"""build_engine's engine-vs-trainer check over several seeds, both comparisons: how far the fp32
one moves with the random prompts (it holds the arithmetic's own gap) against the one in the
engine's arithmetic class, which the rule judges (ratchet/stages/build_engine.py).

    python -m dev.build_check_seeds --model results/local/model --backend numpy --seeds 0 1 2 3 4
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    from ratchet.engines import make_engine
    from ratchet.mismatch.compare import compare, random_prompts, sample
    from ratchet.model.io import load_engine_model
    from ratchet.stages.build_engine import NUM_PROMPTS, TOLERANCE
    from ratchet.trainer.policy import Policy

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a converted model directory (convert_weights')")
    parser.add_argument("--backend", default="numpy", choices=("numpy", "cuda"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--tokens", type=int, default=256, help="engine.selftest_tokens")
    args = parser.parse_args()
    model = load_engine_model(args.model)
    device = "cuda" if args.backend == "cuda" else "cpu"
    engine = make_engine(model, backend=args.backend, max_batch_size=NUM_PROMPTS, max_seq_len=64)
    policy = Policy.from_weights(model.cfg, model.weights, device=device)
    print(f"{model.dtype} engine, tolerance {TOLERANCE[model.dtype]:.0e} (mean |dlogp|)")
    for seed in args.seeds:
        start = time.perf_counter()
        prompts = random_prompts(model.cfg.vocab_size, NUM_PROMPTS, 16, seed=seed,
                                 avoid=tuple(model.cfg.eos_token_ids))
        reqs = sample(engine, prompts, max_new_tokens=max(1, args.tokens // NUM_PROMPTS), seed=seed)
        fp32 = compare(policy, reqs, prefix="")
        own = compare(policy, reqs, compute_dtype=model.dtype, prefix="") if model.dtype != "fp32" else fp32
        print(f"seed {seed}: fp32 arithmetic mean {fp32['logprob_abs_diff_mean']:.3e} max "
              f"{fp32['logprob_abs_diff_max']:.3e}; {model.dtype} autocast mean {own['logprob_abs_diff_mean']:.3e} "
              f"max {own['logprob_abs_diff_max']:.3e}; {int(fp32['num_tokens'])} tokens, "
              f"{time.perf_counter() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
