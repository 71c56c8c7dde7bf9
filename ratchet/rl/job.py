"""A training job as plain data (it crosses to worker processes as JSON), and what every run
does around its loop: start or resume, checkpoint tensors, write its outputs."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ratchet.atomic import write_json, write_parquet
from ratchet.rl.checkpoint import (
    clean_temporaries,
    latest_checkpoint,
    load_optimizer,
    load_rng,
    optimizer_tensors,
    rng_tensors,
)
from ratchet.rl.settings import GRPOConfig
from ratchet.rl.sync import engine_weights, sync_weights
from ratchet.rl.task import Task
from ratchet.rl.trace import weights_digest
from ratchet.rl.update import make_optimizer


@dataclass
class Job:
    grpo: GRPOConfig
    model_dir: str
    train_path: str
    data_source: str
    out_dir: str
    test_path: str | None = None
    backend: str = "numpy"
    max_batch_size: int = 64
    max_seq_len: int = 1024
    eval_max_new_tokens: int = 8
    device: str = "cpu"  # the trainer's torch device ("cuda" on a GPU machine)
    digest: str = ""  # of the settings; a checkpoint under another digest is never resumed
    resume: bool = True
    checkpoints: bool = True
    save_model: bool = True
    vllm_options: dict = field(default_factory=dict)  # the `engine.vllm` section (backend vllm)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Job":
        d = json.loads(text)
        return cls(**{**d, "grpo": GRPOConfig(**d["grpo"])})

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.out_dir) / "checkpoints"

    def load_task(self) -> Task:
        return Task.load(self.model_dir, self.train_path, self.data_source, self.test_path,
                         self.grpo.eval_problems if self.grpo.eval_every else 0)

    def make_engine(self, model, batch_invariant: bool = False, device: int | None = None,
                    rows: int | None = None):
        """`rows`: the most sequences the engine will hold at once (a step's rollouts, the
        in-training eval's problems), where known. Its KV cache is then for those rows alone
        (at 1.5B a slot is 29 MB: 15 GB for engine.max_batch_size 512), and every step keeps
        its decode bucket (the smallest power of two that holds the rows in flight), so the
        same bits. A batch-invariant engine runs every step at its largest batch: no larger
        than the step's answers (the exact forward's, whose scoring takes them all at once)."""
        from ratchet.engines import make_engine

        size = self.max_batch_size if rows is None else max(1, min(self.max_batch_size, rows))
        if batch_invariant:
            size = min(size, self.grpo.groups_per_worker * self.grpo.group_size)
        return make_engine(model, backend=self.backend, max_batch_size=size, max_seq_len=self.max_seq_len,
                           batch_invariant=batch_invariant, device=device, vllm_options=self.vllm_options)


def eval_rows(task: Task) -> int:
    """The in-training eval's problems, all in flight at once on an engine that holds them."""
    return 0 if task.eval_problems is None else len(task.eval_problems)


class TrainerEngine:
    """The split trainer's own engine, holding its current weights rounded (built on first
    use, synced after): its evals and its exact forward run on it."""

    def __init__(self, job: Job, rows: int | None = None):
        self.job, self.engine, self.rows = job, None, rows

    def synced(self, policy):
        from ratchet.model.io import EngineModel

        if self.engine is None:
            model = EngineModel(policy.cfg, engine_weights(policy), self.job.grpo.engine_dtype)
            self.engine = self.job.make_engine(model, batch_invariant=self.job.grpo.exact_forward,
                                               rows=self.rows)
        else:  # on the GPU, no host round trip of the masters
            sync_weights(self.engine, policy)
        return self.engine


def load_start(job: Job, device: str = "cpu", model=None):
    """(EngineModel, Policy on `device`, AdamW) from the converted model (`model`, where it is
    already loaded), as a run starts."""
    from ratchet.model.io import load_engine_model
    from ratchet.trainer.policy import Policy

    model = load_engine_model(job.model_dir) if model is None else model
    policy = Policy.from_weights(model.cfg, model.weights, device=device)
    return model, policy, make_optimizer(policy, job.grpo)


def find_resume(job: Job):
    """The checkpoint to resume from, or None; removes half-written ones."""
    if not (job.resume and job.checkpoints):
        return None
    clean_temporaries(job.checkpoint_dir)
    return latest_checkpoint(job.checkpoint_dir, job.digest)


def trainer_tensors(policy, optimizer) -> dict[str, dict[str, torch.Tensor]]:
    return {"policy": {k: v.clone() for k, v in policy.export_weights().items()},
            "optimizer": optimizer_tensors(optimizer, policy), "rng": rng_tensors()}


def restore_trainer(policy, optimizer, tensors: dict) -> None:
    policy.load_weights({k: v for k, v in tensors["policy"].items()})  # copies onto its device
    load_optimizer(optimizer, policy, tensors["optimizer"])
    load_rng(tensors["rng"])


def relog(rows: list[dict], log) -> None:
    """A resumed run's tracker gets the steps before the checkpoint again, so its history is whole."""
    if log is not None:
        for row in rows:
            log({k: v for k, v in row.items() if k != "step"}, row["step"])


def write_outputs(job: Job, policy, model_cfg, rows: list[dict], trace: list[dict],
                  extra: dict | None = None) -> dict:
    """metrics.parquet, trace.parquet, model/ (engine dtype, with its manifest), summary.json.
    The weights' SHA-256 is the trace's of the last step where it has it: the same masters,
    whose digest costs a device-to-host copy of them and a pass of SHA-256 (seconds at 1.5B)."""
    from ratchet.model.io import save_engine_model

    out = Path(job.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_parquet(out / "metrics.parquet", rows)
    write_parquet(out / "trace.parquet", trace)
    trained = [r for r in rows if "train/loss" in r]
    evals = [r for r in rows if "eval/accuracy" in r]
    last = trace[-1] if trace else {}
    digest = last["weights"] if last.get("step") == job.grpo.steps - 1 and last.get("weights") \
        else weights_digest(policy)
    summary = {"steps": job.grpo.steps, "weights_sha256": digest,
               "last_step": trained[-1] if trained else None,
               "eval_accuracy": [[r["step"], r["eval/accuracy"]] for r in evals],
               "train_s": float(sum(r.get("time/step_s", 0.0) for r in trained)),
               **(extra or {})}
    if job.save_model:
        model_dir = save_engine_model(out / "model", model_cfg, engine_weights(policy),
                                      job.grpo.engine_dtype, tokenizer_dir=job.model_dir)
        summary["model_sha256"] = json.loads((model_dir / "manifest.json").read_text())["file_sha256"]
    write_json(out / "summary.json", summary)
    return summary
