"""train_colocated / train_split: GRPO from the converted model into results/<run>/train/<mode>/
(metrics, trace, final weights with their manifest, checkpoints: a rerun resumes); and the
after-training evals."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ratchet.paths import RunPaths
from ratchet.progress import Progress
from ratchet.rl import MODES


def make_job(cfg: dict, mode: str, out_dir: Path | None = None, **overrides):
    """The training job of `mode` under `cfg` (overrides: GRPOConfig or Job fields)."""
    import dataclasses

    import torch

    from ratchet.device import resolve_backend
    from ratchet.rl.job import Job
    from ratchet.rl.settings import GRPOConfig
    from ratchet.stages import settings
    from ratchet.tracking import sha256_of

    if mode not in MODES:
        raise ValueError(f"training mode {mode!r} is not one of {MODES}")
    paths = RunPaths.from_config(cfg)
    grpo = GRPOConfig.from_config(cfg)
    grpo_fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    grpo = dataclasses.replace(grpo, **{k: v for k, v in overrides.items() if k in grpo_fields})
    # checkpoints are valid only for these settings, this model and this data
    identity = {"settings": settings(f"train_{mode}", cfg), "grpo": dataclasses.asdict(grpo),
                "model": sha256_of(paths.manifest), "data": sha256_of(paths.train_data)}
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
    e = cfg["engine"]
    job = Job(grpo=grpo, model_dir=str(paths.model), train_path=str(paths.train_data),
              data_source=cfg["data"]["source"], out_dir=str(out_dir or paths.train_dir(mode)),
              test_path=str(paths.test_data), backend=resolve_backend(e["backend"]),
              max_batch_size=e["max_batch_size"], max_seq_len=e["max_seq_len"],
              eval_max_new_tokens=cfg["eval"]["max_new_tokens"],
              device="cuda" if torch.cuda.is_available() else "cpu", digest=digest,
              vllm_options=dict(e["vllm"]), checkpoints=grpo.keep_checkpoints > 0)
    return dataclasses.replace(job, **{k: v for k, v in overrides.items() if k not in grpo_fields})


def run_mode(job, mode: str, log=None) -> dict:
    if mode == "colocated":
        from ratchet.rl.colocated import run_colocated

        return run_colocated(job, log)
    from ratchet.rl.split import run_split

    return run_split(job, log)


def _train(cfg: dict, run, mode: str) -> None:
    paths = RunPaths.from_config(cfg)
    job = make_job(cfg, mode)
    g = job.grpo
    print(f"[train_{mode}] {g.steps} steps x {g.problems_per_step} problems x {g.group_size} answers, "
          f"lr {g.lr}, {job.backend} engine in {g.engine_dtype}, -> {job.out_dir}")
    if job.checkpoints:
        from ratchet.preflight import check_checkpoint_disk

        check_checkpoint_disk(cfg, mode, job.checkpoint_dir)
    progress = Progress(f"train_{mode}", g.steps)

    def log(metrics: dict, step: int) -> None:
        run.log_metrics(metrics, step)
        if "train/reward" in metrics:
            seconds = metrics.get("time/step_s")
            rate = f", {metrics['train/num_tokens'] / seconds:.0f} trained tok/s" if seconds else ""
            progress.update(step + 1, f"reward {metrics['train/reward']:.3f}{rate}", unit_seconds=seconds)

    summary = run_mode(job, mode, log=log)
    run.set_tags({"train.mode": mode, "train.weights_sha256": summary["weights_sha256"],
                  "train.model_sha256": summary.get("model_sha256", "")})
    for path in (paths.train_metrics(mode), paths.train_trace(mode), paths.train_summary(mode),
                 paths.train_manifest(mode)):
        run.log_output(path)


def train_colocated(cfg: dict, run) -> None:
    _train(cfg, run, "colocated")


def train_split(cfg: dict, run) -> None:
    _train(cfg, run, "split")


def _eval_after(cfg: dict, run, mode: str) -> None:
    from ratchet.stages.eval_baseline import run_eval

    paths = RunPaths.from_config(cfg)
    summary = run_eval(cfg, run, paths.train_model(mode), f"after_{mode}")
    baseline = paths.eval_json("baseline")
    if baseline.is_file():
        before = json.loads(baseline.read_text())["accuracy"]
        print(f"[eval_after_{mode}] accuracy {before:.3f} -> {summary['accuracy']:.3f}")
        run.log_metrics({"eval/accuracy_gain": summary["accuracy"] - before})


def eval_after_colocated(cfg: dict, run) -> None:
    _eval_after(cfg, run, "colocated")


def eval_after_split(cfg: dict, run) -> None:
    _eval_after(cfg, run, "split")
