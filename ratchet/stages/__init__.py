"""One function per pipeline stage (one per Snakemake rule): the only code that touches MLflow
and results/, so everything it calls runs in a test without them. `STAGES` names the config
sections each reads; the rules pass them as params, so a change reruns exactly those stages."""

from __future__ import annotations

import importlib
import json
import os
import time
import uuid

from ratchet.tracking import PIPELINE_ENV, StageRun

CONFIG_ENV = "RATCHET_CONFIG_JSON"

# stage -> (module, config sections it reads besides run_name/seed/results_dir/tracking)
STAGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "download_model": ("ratchet.stages.download_model", ("model",)),
    "download_data": ("ratchet.stages.download_data", ("data",)),
    "convert_weights": ("ratchet.stages.convert_weights", ("model", "engine")),
    "build_engine": ("ratchet.stages.build_engine", ("engine",)),
    "eval_baseline": ("ratchet.stages.eval_baseline", ("data", "engine", "eval")),
    "bench": ("ratchet.stages.bench", ("engine",)),
    "ablate_decompose": ("ratchet.stages.ablate", ("data", "engine", "ablate")),
    "ablate_fix": ("ratchet.stages.ablate", ("data", "engine", "eval", "ablate")),
    "train_colocated": ("ratchet.stages.train", ("data", "engine", "eval", "train")),
    "train_split": ("ratchet.stages.train", ("data", "engine", "eval", "train")),
    "eval_after_colocated": ("ratchet.stages.train", ("data", "engine", "eval")),
    "eval_after_split": ("ratchet.stages.train", ("data", "engine", "eval")),
    "verify": ("ratchet.stages.verify", ("data", "engine", "eval", "train")),
    "report": ("ratchet.stages.report", ("engine", "ablate")),
}
COMMON = ("run_name", "seed", "results_dir")


def settings(stage: str, cfg: dict) -> dict:
    """The part of the config a stage depends on."""
    return {k: cfg[k] for k in COMMON + STAGES[stage][1]}


def run_stage(stage: str, cfg: dict) -> None:
    module = importlib.import_module(STAGES[stage][0])
    start = time.perf_counter()
    with StageRun(stage, cfg) as run:
        getattr(module, stage)(cfg, run)
        run.log_metrics({"time/stage_s": time.perf_counter() - start})
    print(f"[{stage}] done in {time.perf_counter() - start:.1f} s")


def export_to_jobs(cfg: dict) -> None:
    """Called by the Snakefile: the jobs it starts inherit the validated config and the id of
    this invocation (whose MLflow parent run the first stage creates)."""
    os.environ[CONFIG_ENV] = json.dumps(cfg)
    os.environ.setdefault(PIPELINE_ENV, uuid.uuid4().hex)
