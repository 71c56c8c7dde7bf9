"""ablate_decompose, ablate_fix: read the inputs, run the ablations of ratchet/mismatch/,
write results/<run>/ablate/ and track; `records` gives their headline numbers."""

from __future__ import annotations

import math
import os
import time

import numpy as np

from ratchet.atomic import write_parquet
from ratchet.paths import RunPaths
from ratchet.progress import MeasuredRunEta, Progress
from ratchet.rl.runtime import SMALL_MODEL_PARAMS, Laps


def _one_thread() -> None:
    """A small model on CPU: one torch and one BLAS thread (faster, and the same sums on any
    machine, whatever its core count)."""
    import torch

    torch.set_num_threads(1)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(1)


def make_setup(cfg: dict, with_eval: bool = False):
    """(Setup, AblateSettings) from the converted model, the data splits and the config;
    `with_eval` adds the test problems of the after-training eval (the `eval:` section)."""
    import torch

    from ratchet.data.datasets_io import load_split
    from ratchet.data.prompts import make_prompt_fn
    from ratchet.device import resolve_backend
    from ratchet.mismatch.ablation import AblateSettings, Setup
    from ratchet.model.io import load_engine_model
    from ratchet.rl.task import Task

    paths = RunPaths.from_config(cfg)
    settings = AblateSettings.from_config(cfg)
    e = cfg["engine"]
    backend = resolve_backend(e["backend"])
    model = load_engine_model(paths.model)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
    elif sum(int(np.size(w)) for w in model.weights.values()) < SMALL_MODEL_PARAMS:
        _one_thread()
    task = Task.load(paths.model, paths.train_data, cfg["data"]["source"])
    prompt_fn = make_prompt_fn(task.tokenizer, cfg["data"]["source"])
    test = load_split(paths.test_data)
    questions = list(test["question"])
    measure = [prompt_fn(questions[i % len(questions)]) for i in range(settings.num_rollouts)]
    # a batch-invariant CUDA engine runs every step at its largest bucket: no larger than a batch
    batch = max(settings.num_rollouts, settings.problems_per_step * settings.group_size)
    max_batch = min(e["max_batch_size"], batch) if settings.batch_invariant else e["max_batch_size"]
    setup = Setup(model, task, measure, backend=backend, max_batch_size=max_batch,
                  max_seq_len=e["max_seq_len"], device=device, prompt_fn=prompt_fn,
                  batch_invariant=settings.batch_invariant, vllm_options=e["vllm"])
    if with_eval:
        n_eval = settings.eval_problems or cfg["eval"]["num_problems"]
        setup.eval_problems = test.head(n_eval) if n_eval else test
        setup.eval_max_new_tokens = cfg["eval"]["max_new_tokens"]
    print(f"[ablate] {backend} engine ({settings.engine_dtype}), trainer on {device}, "
          f"lr {settings.lr}, {settings.problems_per_step}x{settings.group_size} answers a step, "
          f"{len(measure)} measurement prompts")
    return setup, settings


def write_ablation(run, frame, table, figure, draw) -> None:
    """An ablation's table and its figure (`draw(frame, path)`), both as the run's outputs."""
    write_parquet(table, frame)
    draw(frame, figure)
    run.log_output(table)
    run.log_output(figure)


# ---------------------------------------------------------------------------- decompose
# a gradient row's columns -> metric names (gradient/... new here; the gap under the trainings' name)
GRADIENT_METRICS = {"cosine": "gradient/cosine", "rel_diff": "gradient/rel_diff", "norm": "gradient/norm",
                    "ref_norm": "gradient/ref_norm", "ratio_max_dev": "gradient/ratio_max_dev",
                    "weight_mean": "train/is_weight_mean", "num_tokens": "train/num_tokens",
                    "gap_mean": "mismatch/logprob_abs_diff_mean", "gap_max": "mismatch/logprob_abs_diff_max"}


def gradient_logger(run, progress, label: str):
    """log_gradient for along_updates: the nested MLflow runs and a line of the job's log."""
    def log_gradient(dtype, updates, rows):
        progress.update(updates)
        for r in rows:  # one nested run per (engine dtype, remedy)
            params = {k: r[k] for k in ("engine_dtype", "variant", "weight_dtype", "old_logprobs",
                                        "is_correction", "exact_forward")}
            run.variant(f"{dtype}/gradient/{r['variant']}", params).log_metrics(
                {name: r[k] for k, name in GRADIENT_METRICS.items() if math.isfinite(r[k])}, step=updates)
        others = "  ".join(f"{r['variant']} 1-cos {1 - r['cosine']:.2e} rel {r['rel_diff']:.2e}"
                           for r in rows if r["variant"] != "reference")
        print(f"[{label}] gradient, {dtype} after {updates:3d} updates, {rows[0]['num_tokens']} "
              f"tokens, gap mean {rows[0]['gap_mean']:.2e}: {others}", flush=True)
    return log_gradient


def print_laps(label: str, laps, what: str = "its run", gradient_counts: dict | None = None) -> None:
    """Where the run's time went by phase and, on a GPU, which phases raised its memory's
    high-water marks (which phase sets the peak); with `gradient_counts`, how many backwards the
    gradients' losses took (variants whose loss gradients agree bit for bit share one)."""
    print(f"[{label}] {what} in {laps.line()}", flush=True)
    if rises := laps.rises_line():
        print(f"[{label}] GPU high-water marks: {rises}", flush=True)
    if gradient_counts:
        print(f"[{label}] gradients: {gradient_counts['losses']} losses (a variant a micro-batch), "
              f"{gradient_counts['backwards']} backwards", flush=True)


def timed_progress(label: str, total: int, points) -> tuple[Progress, dict]:
    """Progress over along_updates' `total` updates whose time left counts the measurements
    after `points` apart from the updates (MeasuredRunEta), and along_updates' two hooks that
    time them: each update as it ends, the measurements after it as they end."""
    eta = MeasuredRunEta(total, points)
    progress = Progress(label, total, unit="update", eta=eta)

    def log_update(update):
        eta.updated(update)
        progress.update(update)

    return progress, {"log_update": log_update, "log_measured": eta.measured}


def ablate_decompose(cfg: dict, run) -> None:
    """The decomposition and the visibility of updates along one GRPO run (the two study the same
    updates: one run of them instead of two identical ones). With ablate.parallel_jobs true the
    remedies' gradients replay it in jobs of their own (ablate_gradient_run), which run beside
    it; otherwise they are measured along this run too, as one part (no replay)."""
    from ratchet.mismatch.ablation import EVERY, gradient_parts
    from ratchet.mismatch.decompose import along_updates
    from ratchet.report.figures import decomposition_figure, visibility_figure

    paths = RunPaths.from_config(cfg)
    setup, settings = make_setup(cfg)
    gradients = gradient_parts(cfg["ablate"]) == [EVERY]
    start = time.perf_counter()
    gradient_at = settings.gradient_updates if gradients else ()
    total = max(*settings.updates, settings.visibility_updates, *gradient_at)
    # the measurements take most of the time: their pace apart from the updates'
    progress, timing = timed_progress("ablate_decompose", total, (*settings.updates, *gradient_at))

    def log(updates, rows):
        progress.update(updates)
        for r in rows:  # one nested run per (engine dtype, source), the training runs' metric names
            variant = run.variant(f"{r['engine_dtype']}/{r['source']}",
                                  {"engine_dtype": r["engine_dtype"], "source": r["source"],
                                   "reference": r["reference"], "against": r["against"]})
            variant.log_metrics({f"mismatch/logprob_{k}": r[k] for k in ("abs_diff_mean", "abs_diff_p99",
                                                                          "abs_diff_max")}
                                | {"mismatch/ratio_outside_share": r["ratio_outside_share"],
                                   "mismatch/kl_k3": r["kl_k3"], "mismatch/num_tokens": r["num_tokens"]},
                                step=updates)
        for r in rows:
            print(f"[ablate_decompose] {updates:3d} updates  {r['engine_dtype']} {r['source']:16s} "
                  f"mean {r['abs_diff_mean']:.2e}  p99 {r['abs_diff_p99']:.2e}  "
                  f"max {r['abs_diff_max']:.2e}  outside {r['ratio_outside_share']:.4f}", flush=True)

    def log_visibility(update, rows):
        progress.update(update)
        for r in rows:
            run.variant(f"{r['dtype']}/visibility", {"engine_dtype": r["dtype"]}).log_metrics(
                {"sync/visible_share": r["changed_share"], "sync/masters_off_grid_share": r["off_grid_share"],
                 "sync/masters_moved_share": r["moved_share"]}, step=update)
        print(f"[ablate_decompose] visibility, update {update:3d}  " + "  ".join(
            f"{r['dtype']} changed {r['changed_share']:.4f} off-grid {r['off_grid_share']:.4f}"
            for r in rows), flush=True)

    laps, counts = Laps(), {}
    frame, vis, grad = along_updates(setup, settings, log=log, log_visibility=log_visibility, laps=laps,
                                     gradient_at=gradient_at, log_gradient=gradient_logger(run, progress, "ablate_decompose"),
                                     gradient_counts=counts, **timing)
    run.log_metrics({"time/decompose_s": time.perf_counter() - start})  # all: one GRPO run
    print_laps("ablate_decompose", laps, gradient_counts=counts)
    write_ablation(run, frame, paths.decompose_table, paths.decompose_figure, decomposition_figure)
    write_ablation(run, vis, paths.visibility_table, paths.visibility_figure, visibility_figure)
    if gradients:
        write_parquet(paths.gradient_part(EVERY), grad)
        run.log_output(paths.gradient_part(EVERY))


def ablate_gradient_run(cfg: dict, run, dtype: str) -> None:
    """Every remedy's policy gradient against the on-policy one, on fresh batches of one engine
    dtype after each of ablate.gradient_updates updates of ablate_decompose's GRPO run, replayed
    here to the same bits (a job a dtype, so that they run beside the decomposition:
    ablate.parallel_jobs)."""
    from ratchet.mismatch.ablation import ENGINE_DTYPES
    from ratchet.mismatch.decompose import along_updates

    if dtype not in ENGINE_DTYPES:
        raise ValueError(f"ablate_gradient_run: dtype={dtype!r} is not one of {ENGINE_DTYPES}")
    paths = RunPaths.from_config(cfg)
    setup, settings = make_setup(cfg)
    start = time.perf_counter()
    progress, timing = timed_progress(f"ablate_gradient_run {dtype}", max(settings.gradient_updates),
                                      settings.gradient_updates)
    laps, counts = Laps(), {}
    _, _, grad = along_updates(setup, settings, visibility_updates=0, measure_at=(),
                               gradient_at=settings.gradient_updates, gradient_dtypes=(dtype,),
                               log_gradient=gradient_logger(run, progress, "ablate_gradient_run"), laps=laps,
                               gradient_counts=counts, **timing)
    run.log_metrics({"time/gradient_s": time.perf_counter() - start})
    print_laps("ablate_gradient_run", laps, gradient_counts=counts)
    write_parquet(paths.gradient_part(dtype), grad)
    run.log_output(paths.gradient_part(dtype))


def ablate_gradient(cfg: dict, run) -> None:
    """The gradients' parts (ablate_gradient_run's, or ablate_decompose's one) as one table, the
    rows of one run measuring every dtype in turn, and its figure."""
    from ratchet.mismatch.ablation import EVERY, gradient_parts
    from ratchet.mismatch.gradient import gather_dtypes
    from ratchet.report.figures import gradient_figure

    paths = RunPaths.from_config(cfg)
    made = lambda d: "ablate_decompose" if d == EVERY else f"ablate_gradient_run --job dtype={d}"  # noqa: E731
    parts = [read_part(paths.gradient_part(d), "ablate_gradient", made(d)) for d in gradient_parts(cfg["ablate"])]
    write_ablation(run, gather_dtypes(parts), paths.gradient_table, paths.gradient_figure, gradient_figure)


def read_part(path, stage: str, makes: str):
    """One job's table, or one error naming the command that makes it."""
    import pandas as pd

    from ratchet.errors import MissingInputError

    if not path.is_file():
        raise MissingInputError(f"{stage}: input {path} does not exist; run `snakemake {stage}` "
                                f"(or `ratchet {makes}`)")
    return pd.read_parquet(path)


def ablate_decompose_vllm(cfg: dict, run) -> None:
    """ablate_decompose's sources measured on vLLM beside ratchet's engine: both synced from
    the same masters after each update count of one GRPO run (sampled by ratchet's engine),
    each scored on its own fresh rollouts. vLLM's `exact` is its prompt log-probabilities
    (prefill) of its own sampled tokens: how far its sampling is from its own replay."""
    from ratchet.mismatch.decompose import along_updates
    from ratchet.report.figures import decomposition_figure
    from ratchet.report.tables import by_engine

    paths = RunPaths.from_config(cfg)
    setup, settings = make_setup(cfg)
    if setup.backend == "vllm":
        raise ValueError("ablate_decompose_vllm: engine.backend is the run's own engine (the GRPO "
                         "trajectory's, numpy or cuda); vLLM is measured beside it")
    if not (setup.vllm_options or {}).get("enforce_eager"):  # the only way it starts here
        print("[ablate_decompose_vllm] vLLM eager (engine.vllm.enforce_eager on for this rule): its "
              "start-up compilation refuses the trajectory's deterministic torch mode", flush=True)
        setup.vllm_options = {**(setup.vllm_options or {}), "enforce_eager": True}
    start = time.perf_counter()
    progress = Progress("ablate_decompose_vllm", max(settings.updates), unit="update")

    def log(updates, rows):
        progress.update(updates)
        for r in rows:
            print(f"[ablate_decompose_vllm] {updates:3d} updates  {r['backend']:5s} {r['engine_dtype']} "
                  f"{r['source']:16s} mean {r['abs_diff_mean']:.2e}  max {r['abs_diff_max']:.2e}", flush=True)
            variant = run.variant(f"{r['backend']}/{r['engine_dtype']}/{r['source']}",
                                  {"backend": r["backend"], "engine_dtype": r["engine_dtype"], "source": r["source"]})
            variant.log_metrics({"mismatch/logprob_abs_diff_mean": r["abs_diff_mean"],
                                 "mismatch/logprob_abs_diff_max": r["abs_diff_max"],
                                 "mismatch/kl_k3": r["kl_k3"]}, step=updates)

    frame, _, _ = along_updates(setup, settings, log=log, visibility_updates=0,
                                backends=(setup.backend, "vllm"))
    run.log_metrics({"time/decompose_vllm_s": time.perf_counter() - start})
    write_ablation(run, frame, paths.decompose_vllm_table, paths.decompose_vllm_figure,
                   lambda f, path: decomposition_figure(by_engine(f), path, sharey=True,
                                                        labels=VLLM_LABELS))


# vLLM has no teacher forcing through its sampling arithmetic: its `exact` is its replay
VLLM_LABELS = {"exact": "the engine's replay of its tokens (ratchet: teacher forcing; vLLM: prompt log-probs)"}


# ---------------------------------------------------------------------------- fix
# fix_runs' per-step columns -> the metric names of the training runs
FIX_METRICS = {"reward": "train/reward", "num_tokens": "train/num_tokens", "updates": "train/num_updates_total",
               "is_weight_mean": "train/is_weight_mean", "is_masked_share": "train/is_masked_share",
               "clip_fraction": "train/clip_fraction", "gap_mean": "mismatch/logprob_abs_diff_mean",
               "gap_p99": "mismatch/logprob_abs_diff_p99", "gap_max": "mismatch/logprob_abs_diff_max",
               "ratio_outside_share": "mismatch/ratio_outside_share", "kl_k3": "mismatch/kl_k3",
               "visible_share": "sync/visible_share", "masters_off_grid_share": "sync/masters_off_grid_share",
               "weights_parity": "sync/weights_parity"}


def ablate_fix_run(cfg: dict, run, remedy: str) -> None:
    """One run of ablate_fix (a remedy of FIX_RUNS; a job each, so that they run side by side:
    ablate.parallel_jobs), or `all`: every run of ablate.fix_runs in turn, in one process."""
    from ratchet.mismatch.ablation import EVERY, FIX_RUNS
    from ratchet.mismatch.fix import fix_runs

    if remedy not in (*FIX_RUNS, EVERY):
        raise ValueError(f"ablate_fix_run: remedy={remedy!r} is not one of {(*FIX_RUNS, EVERY)}")
    paths = RunPaths.from_config(cfg)
    setup, settings = make_setup(cfg, with_eval=True)
    names = settings.fix_runs if remedy == EVERY else (remedy,)
    start = time.perf_counter()
    progress = Progress(f"ablate_fix_run {remedy}", len(names) * settings.fix_steps)

    def log(name, step, row):
        # the job's log gets a line a step, as a training's does (the console gets the progress)
        print(f"[ablate_fix_run] {name:5s} step {step:3d}  reward {row['reward']:.3f}  "
              f"|dlogp| mean {row.get('gap_mean', np.nan):.1e} max {row.get('gap_max', np.nan):.3g}  "
              f"visible {row.get('visible_share', np.nan):.4f}", flush=True)
        # one nested run per remedy, under the names the trainings log (train/..., mismatch/...)
        variant = run.variant(name, {"fix_run": name, **FIX_RUNS[name]})
        variant.log_metrics({FIX_METRICS[k]: v for k, v in row.items()
                             if k in FIX_METRICS and np.isfinite(v)}, step=step)
        progress.update(names.index(name) * settings.fix_steps + step + 1, f"{name} reward {row['reward']:.3f}")

    laps = Laps()
    steps, summary = fix_runs(setup, settings, names, log=log, laps=laps)
    print_laps("ablate_fix_run", laps, "its runs" if len(names) > 1 else "its run")
    print("[ablate_fix_run] after training:\n" + summary.to_string(index=False), flush=True)
    write_parquet(paths.fix_run_steps(remedy), steps)
    write_parquet(paths.fix_run_summary(remedy), summary)
    run.log_metrics({"time/fix_s": time.perf_counter() - start})
    for path in (paths.fix_run_steps(remedy), paths.fix_run_summary(remedy)):
        run.log_output(path)


def ablate_fix(cfg: dict, run) -> None:
    """ablate_fix_run's jobs as one table of steps and one of runs (in ablate.fix_runs' order),
    and the figure of the fix against TIS and MIS."""
    from ratchet.mismatch.ablation import fix_jobs
    from ratchet.mismatch.fix import gather
    from ratchet.report.figures import fix_figure

    paths = RunPaths.from_config(cfg)
    made = lambda r: f"ablate_fix_run --job remedy={r}"  # noqa: E731
    jobs = fix_jobs(cfg["ablate"])
    steps = gather([read_part(paths.fix_run_steps(r), "ablate_fix", made(r)) for r in jobs])
    runs = gather([read_part(paths.fix_run_summary(r), "ablate_fix", made(r)) for r in jobs])
    print("[ablate_fix] after training:\n" + runs.to_string(index=False), flush=True)
    write_parquet(paths.fix_steps, steps)
    write_parquet(paths.fix_table, runs)
    fix_figure(steps, paths.fix_figure)
    for path in (paths.fix_steps, paths.fix_table, paths.fix_figure):
        run.log_output(path)


# A gap of 0 (bit-identical log-probabilities) divides as this: the float32 spacing of a
# log-probability near -8 (2**-20), so a ratio stays a finite number, then a lower bound.
LOGP_RESOLUTION = 2.0 ** -20


def gap_ratio(total: float, fixed: float) -> float:
    """total / fixed, with a fixed gap under LOGP_RESOLUTION counted as LOGP_RESOLUTION."""
    return float(total) / max(float(fixed), LOGP_RESOLUTION)


def records(settings, decompose, vis, runs, gradient=None) -> dict:
    """summary.json: the ablations' headline numbers (None where not measured); a fix's ratio is
    the total gap over what the fix leaves (`exact`: rounded weights and the engine's arithmetic;
    `rounding_only`: the rounded weights in fp32 maths, the `fixed` source); `gradient_*`: each
    variant's |g - g_ref| / |g_ref| after the most updates, on the pipeline's engine dtype."""
    out: dict = {"engine_dtype": settings.engine_dtype, "lr": settings.lr,
                 "num_rollouts": settings.num_rollouts, "max_new_tokens": settings.max_new_tokens}
    if decompose is not None:
        at = int(decompose["updates"].max())
        dtype = settings.engine_dtype if settings.engine_dtype in set(decompose["engine_dtype"]) \
            else str(decompose["engine_dtype"].iloc[0])
        last = decompose[(decompose["updates"] == at) & (decompose["engine_dtype"] == dtype)]
        get = lambda source, m: float(last.loc[last["source"] == source, m].iloc[0])  # noqa: E731
        full = "exact" if "exact" in set(decompose["source"]) else "fixed"
        out.update({"fix_max_gap_updates": at, "fix_max_gap_dtype": dtype, "fix_max_gap_source": full,
                    "total_max_gap": get("total", "abs_diff_max"),
                    "exact_max_gap": get(full, "abs_diff_max"),
                    "fixed_max_gap": get("fixed", "abs_diff_max"),
                    "fix_max_gap_ratio": gap_ratio(get("total", "abs_diff_max"), get(full, "abs_diff_max")),
                    "fix_max_gap_ratio_is_lower_bound": get(full, "abs_diff_max") < LOGP_RESOLUTION,
                    "fix_mean_gap_ratio": gap_ratio(get("total", "abs_diff_mean"), get(full, "abs_diff_mean")),
                    "fix_rounding_only_max_gap_ratio": gap_ratio(get("total", "abs_diff_max"),
                                                                 get("fixed", "abs_diff_max")),
                    "fix_rounding_only_mean_gap_ratio": gap_ratio(get("total", "abs_diff_mean"),
                                                                  get("fixed", "abs_diff_mean")),
                    "weight_rounding_max_gap": get("weight_rounding", "abs_diff_max"),
                    "engine_kernels_max_gap": get("engine_kernels", "abs_diff_max")})
        wide = decompose.pivot_table(index=["engine_dtype", "updates"], columns="source",
                                     values="abs_diff_max")
        for key, source in (("fix_max_gap_ratio_by_updates", full),
                            ("fix_rounding_only_max_gap_ratio_by_updates", "fixed")):
            out[key] = {d: {str(u): gap_ratio(wide.loc[(d, u), "total"], wide.loc[(d, u), source])
                            for u in sorted(decompose["updates"].unique())}
                        for d in dict.fromkeys(decompose["engine_dtype"])}
    if vis is not None:
        for dtype in ("fp16", "bf16"):
            one = vis[(vis["update"] == 1) & (vis["dtype"] == dtype)]
            last = vis[(vis["update"] == vis["update"].max()) & (vis["dtype"] == dtype)]
            out[f"visibility_{dtype}_update1"] = float(one["changed_share"].iloc[0]) if len(one) else None
            out[f"off_grid_{dtype}_last"] = float(last["off_grid_share"].iloc[0]) if len(last) else None
        out["visibility_updates"] = int(vis["update"].max())
        out["masters_moved_update1"] = float(vis.loc[vis["update"] == 1, "moved_share"].iloc[0]) \
            if (vis["update"] == 1).any() else None
    if runs is not None and len(runs):
        by = runs.set_index("run")
        gap = by["final_gap_max"]
        full = "exact" if "exact" in by.index else "fix"
        if {"none", full} <= set(by.index):
            out["fix_runs_max_gap_ratio"] = gap_ratio(gap["none"], gap[full])
        if {"none", "fix"} <= set(by.index):
            out["fix_runs_rounding_only_max_gap_ratio"] = gap_ratio(gap["none"], gap["fix"])
        for name in by.index:
            if "accuracy" in by:
                out[f"accuracy_{name}"] = float(by.loc[name, "accuracy"])
            out[f"final_gap_max_{name}"] = float(by.loc[name, "final_gap_max"])
    if gradient is not None and len(gradient):
        dtype = settings.engine_dtype if settings.engine_dtype in set(gradient["engine_dtype"]) \
            else str(gradient["engine_dtype"].iloc[0])
        part = gradient[gradient["engine_dtype"] == dtype]
        last = part[part["updates"] == part["updates"].max()].set_index("variant")
        out.update({"gradient_updates": int(part["updates"].max()), "gradient_dtype": dtype,
                    "gradient_gap_mean": float(last["gap_mean"].iloc[0])})
        for variant in last.index.drop("reference", errors="ignore"):
            out[f"gradient_rel_diff_{variant}"] = float(last.loc[variant, "rel_diff"])
    return out
