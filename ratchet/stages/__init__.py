"""One function per pipeline stage (one per Snakemake rule): the only code that touches MLflow
and results/, so everything it calls runs in a test without them. The registry
(`registry.STAGES`) says what each reads, writes and depends on."""

from __future__ import annotations

import importlib
import json
import os
import time
import uuid
from pathlib import Path

from ratchet.atomic import write_text
from ratchet.stages.guard import (
    check_inputs,
    check_overwrite,
    run_directory_lock,
    write_stamp,
)
from ratchet.stages.registry import (  # noqa: F401 (the package's API)
    COMMON,
    GPU_STAGES,
    STAGES,
    Stage,
    gpu_memory_wanted,
    gpus_wanted,
    job_label,
    settings,
)
from ratchet.tracking import PIPELINE_ENV, StageRun

CONFIG_ENV = "RATCHET_CONFIG_JSON"


def run_stage(stage: str, cfg: dict, by_hand: bool = False, force: bool = False,
              job: dict[str, str] | None = None) -> None:
    """Run one stage (one `job` of a stage run per job) under its MLflow run. `by_hand`: not
    started by the pipeline, so its inputs are checked, outputs made under other settings are
    kept unless `force`, and it holds the run directory alone."""
    if by_hand:
        check_inputs(stage, cfg, job)
        if not force:
            check_overwrite(stage, cfg, job)
    module = importlib.import_module(STAGES[stage].module)
    label = job_label(stage, job)
    start = time.perf_counter()
    peak = _gpu_peak(stage)
    try:
        with run_directory_lock(cfg, exclusive=by_hand), StageRun(label, cfg) as run:
            getattr(module, stage)(cfg, run, **(job or {}))
            held = peak.stop() if peak is not None else None
            split = _allocator_split(stage)
            run.log_metrics({"time/stage_s": time.perf_counter() - start,
                             **({"gpu/peak_gib": held} if held else {}),
                             **{f"gpu/{k}": v for k, v in split.items()}})
            write_stamp(stage, cfg, job)
    finally:
        if peak is not None:
            peak.stop()  # a failed stage's sampler too
    if held:  # what config gpu_memory_gib is set from
        print(f"[{label}] peak GPU memory {held:.1f} GiB (this process, as nvidia-smi sees it)")
    if split:  # and what would lower it
        print(f"[{label}] by allocator: " + ", ".join(f"{k.removesuffix('_gib').replace('_', ' ')} "
                                                     f"{v:.1f} GiB" for k, v in split.items()))
    print(f"[{label}] done in {time.perf_counter() - start:.1f} s")


def _allocator_split(stage: str) -> dict[str, float]:
    if stage not in GPU_STAGES:
        return {}
    from ratchet.gpu_memory import allocator_split

    return allocator_split()


def _gpu_peak(stage: str):
    """A GPU stage's peak memory, sampled while it runs where CUDA and nvidia-smi are."""
    if stage not in GPU_STAGES or os.environ.get("CUDA_VISIBLE_DEVICES") in ("", "-1"):
        return None
    from ratchet.gpu_memory import ProcessPeak

    return ProcessPeak()


def claim_gpus_for(stage: str, cfg: dict, jobs: list[dict[str, str] | None] | None = None) -> None:
    """A GPU stage's GPUs on a machine of several, and the memory it waits for on them
    (ratchet/gpu_claim.py): claimed by the CLI, where a job's process starts, before its
    preflight or the stage can start CUDA."""
    if stage in GPU_STAGES:
        from ratchet.gpu_claim import claim_gpus
        from ratchet.gpu_memory import allocator_defaults

        allocator_defaults()
        claim_gpus(stage, gpus_wanted(stage, cfg), gpu_memory_wanted(stage, cfg, jobs))


def pipeline_id_file(cfg: dict) -> Path:
    return Path(cfg["results_dir"]) / ".pipelines" / f"current-{cfg['run_name']}"


def export_to_jobs(cfg: dict, main_process: bool = True) -> None:
    """Called by the Snakefile: its jobs inherit the validated config and the id of this
    invocation (its MLflow parent run). The main process writes the id to a file beside the
    results, so that jobs a cluster starts in an empty environment find the same one."""
    os.environ[CONFIG_ENV] = json.dumps(cfg)
    marker = pipeline_id_file(cfg)
    if main_process:
        os.environ.setdefault(PIPELINE_ENV, uuid.uuid4().hex)
        write_text(marker, os.environ[PIPELINE_ENV])
    elif PIPELINE_ENV not in os.environ and marker.is_file():
        os.environ[PIPELINE_ENV] = marker.read_text().strip()
