"""build_engine: pick the backend, compile and self-test the kernels (CUDA), and check the
engine against the trainer on the engine's own rounded weights (fp32 arithmetic, and the
engine dtype's autocast). The verdict is the comparison in the engine's own arithmetic class
(autocast in its dtype; fp32 for an fp32 engine): a gap beyond tolerance there fails the rule.
The fp32 comparison is reported beside it, since it also holds the arithmetic's own gap, which
on Qwen2.5-0.5B's outlier activations can pass an fp16 engine's whole tolerance on some seeds
(results/records/cpu-build-check-seeds.txt)."""

from __future__ import annotations

import time

from ratchet.atomic import write_json
from ratchet.device import describe, resolve_backend
from ratchet.paths import RunPaths

# mean |difference of log p| the engine may show against the trainer on its own weights, in
# its own arithmetic class (VERDICT)
TOLERANCE = {"fp32": 1e-5, "fp16": 2e-2, "bf16": 1e-1}
VERDICT = {"fp32": "fp32_arithmetic", "fp16": "fp16_autocast", "bf16": "bf16_autocast"}
NUM_PROMPTS = 8


def selftest_requests(engine, model_cfg, seed: int, tokens: int) -> list:
    """The self-test's answers: NUM_PROMPTS random prompts of 16 tokens (no eos among them),
    `tokens` new tokens in all, sampled by `engine`."""
    from ratchet.mismatch.compare import random_prompts, sample

    prompts = random_prompts(model_cfg.vocab_size, NUM_PROMPTS, 16, seed=seed, avoid=tuple(model_cfg.eos_token_ids))
    return sample(engine, prompts, max_new_tokens=max(1, tokens // NUM_PROMPTS), seed=seed)


def trainer_checks(policy, reqs: list, dtype: str) -> dict[str, dict]:
    """The trainer's log-probabilities of the answers against the engine's: in fp32 arithmetic,
    and for a 16-bit engine in its own (autocast in `dtype`); VERDICT names the judged one."""
    from ratchet.mismatch.compare import compare

    checks = {"fp32_arithmetic": compare(policy, reqs, prefix="selftest/")}
    if dtype != "fp32":
        checks[f"{dtype}_autocast"] = compare(policy, reqs, compute_dtype=dtype, prefix="selftest/")
    return checks


def build_engine(cfg: dict, run) -> None:
    from ratchet.engines import make_engine
    from ratchet.model.io import load_engine_model
    from ratchet.trainer.policy import Policy

    paths = RunPaths.from_config(cfg)
    e = cfg["engine"]
    backend = resolve_backend(e["backend"])
    record: dict = {"backend": backend, "dtype": e["dtype"], "device": describe()}
    model = load_engine_model(paths.model)
    cfg_m = model.cfg
    if backend == "cuda":
        from ratchet.engine.cuda import loader, selftest

        t0 = time.perf_counter()
        # fresh random inputs every build, at this model's attention shape; raises on a mismatch
        kernels = selftest.selftest(e["dtype"], shapes=((cfg_m.head_dim, cfg_m.num_heads,
                                                          cfg_m.num_kv_heads),))
        record["kernels"] = {"compile_and_test_s": time.perf_counter() - t0,
                             "source_sha256": loader.source_hashes(), "selftest": kernels}
        print(selftest.format_results(kernels))

    engine = make_engine(model, backend=backend, max_batch_size=e["max_batch_size"],
                         max_seq_len=e["max_seq_len"], vllm_options=e["vllm"])
    t0 = time.perf_counter()
    reqs = selftest_requests(engine, cfg_m, cfg["seed"], e["selftest_tokens"])
    sample_s = time.perf_counter() - t0
    policy = Policy.from_weights(cfg_m, model.weights, device="cuda" if backend in ("cuda", "vllm") else "cpu")
    checks = trainer_checks(policy, reqs, e["dtype"])
    same_weights = checks["fp32_arithmetic"]
    verdict = VERDICT[e["dtype"]]
    gap = checks[verdict]["selftest/logprob_abs_diff_mean"]
    tol = TOLERANCE[e["dtype"]]
    record["selftest"] = {"num_tokens": int(same_weights["selftest/num_tokens"]),
                          "sample_s": sample_s, "tolerance_mean_abs": tol, "verdict": verdict,
                          "passed": bool(gap <= tol), "trainer_variants": checks}
    for name, metrics in checks.items():
        print(f"[build_engine] engine vs trainer ({name}): mean |dlogp| "
              f"{metrics['selftest/logprob_abs_diff_mean']:.3e}, max "
              f"{metrics['selftest/logprob_abs_diff_max']:.3e} over "
              f"{int(metrics['selftest/num_tokens'])} tokens")
    run.log_metrics({k: v for k, v in same_weights.items() if k.startswith("selftest/")})
    if not record["selftest"]["passed"]:
        raise RuntimeError(f"build_engine: engine ({backend}, {e['dtype']}) disagrees with the "
                           f"trainer on its own weights ({verdict}): mean |dlogp| {gap:.3e} > {tol:.0e}")
    write_json(paths.build, record)
    run.log_output(paths.build)
