"""GPU memory against the profile's statements, said where the user looks. A GPU stage that runs
out of memory fails with one line that says what to change: the settings that set its peak,
with their values, and the GiB the profile states for it (the line Snakemake shows from the
failed rule's log, where a traceback through torch or CuPy would end in an allocator's numbers
and no setting of ours). And the pipeline's start warns where the largest GPU is smaller than
some rules' stated peaks, before the first of them runs out."""

from __future__ import annotations

from ratchet.stages.registry import GPU_STAGES, gpu_memory_wanted, memory_knobs

# torch.OutOfMemoryError, cupy.cuda.memory.OutOfMemoryError; the rest as CUDA, cuBLAS and an
# engine process's relayed error word it
_CLASS = "OutOfMemoryError"
_PACKAGES = ("torch", "cupy", "cupy_backends")
_TEXTS = ("CUDA out of memory", "cudaErrorMemoryAllocation", "CUBLAS_STATUS_ALLOC_FAILED",
          "CUDA_ERROR_OUT_OF_MEMORY", "Out of memory allocating")  # the last: CuPy's pool


def is_gpu_oom(exc: BaseException | None) -> bool:
    """Whether `exc`, or an error it was raised from or while handling, is the GPU's memory running out."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        kind = type(exc)
        if kind.__name__ == _CLASS and kind.__module__.split(".")[0] in _PACKAGES:
            return True
        if any(text in str(exc) for text in _TEXTS):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _value(cfg: dict, key: str):
    node = cfg
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def oom_message(stage: str, cfg: dict, exc: BaseException, jobs: list | None = None) -> str:
    """One line: what ran out, the settings that set the stage's peak, and what to try."""
    said = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    said = said if len(said) <= 160 else said[:157] + "..."
    knobs = memory_knobs(stage)
    values = ", ".join(f"{k}={'null' if (v := _value(cfg, k)) is None else v}" for k in knobs)
    line = f"{stage} ran out of GPU memory ({said})."
    if knobs:
        line += f" Its peak follows {values}: lower one"
        example = next((f"{k}={v // 2}" for k in knobs if isinstance(v := _value(cfg, k), int) and v > 1), None)
        if example:
            line += f" (say {example}: an override after the stage's command, or snakemake --config set='{example}')"
        line += "."
    stated = gpu_memory_wanted(stage, cfg, jobs)
    if stated > 0:
        line += (f" The profile states {stated:g} GiB for it (gpu_memory_gib): if other GPU jobs ran beside it,"
                 " raise that, or run one GPU job at a time (--resources gpu_jobs=1).")
    else:
        line += " If other GPU jobs ran beside it, run one at a time (--resources gpu_jobs=1)."
    return line


def gpu_memory_shortfall(cfg: dict, totals: dict[str, float], stages: set[str] | None = None) -> str | None:
    """A warning where the profile states more GPU memory for some GPU rules (gpu_memory_gib, a
    measured peak with a few GiB to spare) than the largest GPU here has; None where all fit or
    nothing is known. A warning, not an error: the statements may predate smaller settings.
    `stages`: the rules this invocation runs, where known, so that a rule run only on demand
    (ablate_decompose_vllm) is not named to a user who did not ask for it."""
    if not totals:
        return None
    largest = max(totals.values())
    runs = GPU_STAGES if stages is None else [s for s in GPU_STAGES if s in stages]
    over = {s: gib for s in runs if (gib := gpu_memory_wanted(s, cfg)) > largest}
    over |= {label: float(gib) for label, gib in (cfg.get("gpu_memory_gib") or {}).items()  # a job's own
             if label.split("-")[0] in runs and "-" in label and gib is not None and gib > largest}
    if not over:
        return None
    knobs = sorted({memory_knobs(s.split("-")[0])[0] for s in over})
    rules = ", ".join(f"{s} {gib:g}" for s, gib in sorted(over.items(), key=lambda kv: -kv[1]))
    return (f"the largest GPU here has {largest:.0f} GiB, and the profile states more for {rules} GiB "
            f"(gpu_memory_gib, measured peaks): those rules run alone on it and may run out of memory. "
            f"Lower {' or '.join(knobs)} (then gpu_memory_gib), or use a larger GPU")


def check_gpu_memory(cfg: dict, backend: str, stages: set[str] | None = None) -> str | None:
    """gpu_memory_shortfall on this machine's visible GPUs, for a profile that runs on them."""
    if backend not in ("cuda", "vllm"):
        return None
    from ratchet.gpu_claim import visible_gpus
    from ratchet.gpu_memory import gpu_totals_gib

    gpus = visible_gpus()
    return gpu_memory_shortfall(cfg, gpu_totals_gib(gpus) if gpus else {}, stages)
