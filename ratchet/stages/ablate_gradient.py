"""ablate_gradient: the policy gradient each remedy computes on a fresh batch against the
on-policy one (ratchet/mismatch/gradient.py), written to results/<run>/ablate/ and tracked,
one nested MLflow run per (engine dtype, variant)."""

from __future__ import annotations

import math
import time

from ratchet.paths import RunPaths
from ratchet.progress import Progress
from ratchet.stages.ablate import write_ablation, make_setup

# a row's columns -> metric names (gradient/... new here; the gap under the trainings' name)
GRADIENT_METRICS = {"cosine": "gradient/cosine", "rel_diff": "gradient/rel_diff", "norm": "gradient/norm",
                    "ref_norm": "gradient/ref_norm", "ratio_max_dev": "gradient/ratio_max_dev",
                    "weight_mean": "train/is_weight_mean", "num_tokens": "train/num_tokens",
                    "gap_mean": "mismatch/logprob_abs_diff_mean", "gap_max": "mismatch/logprob_abs_diff_max"}


def ablate_gradient(cfg: dict, run) -> None:
    from ratchet.mismatch.gradient import gradient_errors
    from ratchet.report.figures import gradient_figure

    paths = RunPaths.from_config(cfg)
    setup, settings = make_setup(cfg)
    start = time.perf_counter()
    batches = [(d, u) for d in settings.engine_dtypes for u in settings.gradient_updates]
    progress = Progress("ablate_gradient", len(batches), unit="batch", units="batches")

    def log(dtype, updates, rows):
        progress.update(batches.index((dtype, updates)) + 1, f"{dtype} after {updates} updates")
        for r in rows:
            params = {k: r[k] for k in ("engine_dtype", "variant", "weight_dtype", "old_logprobs",
                                        "is_correction", "exact_forward")}
            run.variant(f"{dtype}/{r['variant']}", params).log_metrics(
                {name: r[k] for k, name in GRADIENT_METRICS.items() if math.isfinite(r[k])}, step=updates)
        others = "  ".join(f"{r['variant']} 1-cos {1 - r['cosine']:.2e} rel {r['rel_diff']:.2e}"
                           for r in rows if r["variant"] != "reference")
        print(f"[ablate_gradient] {dtype} after {updates:3d} updates, {rows[0]['num_tokens']} tokens, "
              f"gap mean {rows[0]['gap_mean']:.2e}: {others}", flush=True)

    frame = gradient_errors(setup, settings, log=log)
    run.log_metrics({"time/gradient_s": time.perf_counter() - start})
    write_ablation(run, frame, paths.gradient_table, paths.gradient_figure, gradient_figure)
