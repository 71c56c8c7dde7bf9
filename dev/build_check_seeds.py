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
    from ratchet.model.io import load_engine_model
    from ratchet.stages.build_engine import NUM_PROMPTS, TOLERANCE, VERDICT, selftest_requests, trainer_checks
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
    print(f"{model.dtype} engine, tolerance {TOLERANCE[model.dtype]:.0e} (mean |dlogp|), judged: {VERDICT[model.dtype]}")
    for seed in args.seeds:
        start = time.perf_counter()
        checks = trainer_checks(policy, selftest_requests(engine, model.cfg, seed, args.tokens), model.dtype)
        said = "; ".join(f"{name} mean {m['selftest/logprob_abs_diff_mean']:.3e} max "
                         f"{m['selftest/logprob_abs_diff_max']:.3e}" for name, m in checks.items())
        print(f"seed {seed}: {said}; {int(checks['fp32_arithmetic']['selftest/num_tokens'])} tokens, "
              f"{time.perf_counter() - start:.0f} s", flush=True)

if __name__ == "__main__":
    main()
