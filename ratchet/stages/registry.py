"""Every pipeline stage: its module, the config sections it depends on, what it reads and
writes. The Snakemake rules declare the same paths (a test compares them with a dry run), so
a stage run by hand can name the rule that makes a missing input, and its help says what it
touches."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ratchet.paths import RunPaths
from ratchet.rl import MODES

COMMON = ("run_name", "seed", "results_dir")  # every stage depends on these


@dataclass(frozen=True)
class Stage:
    module: str
    sections: tuple[str, ...]  # config sections read besides COMMON (and tracking)
    summary: str
    reads: Callable[[RunPaths], list[Path]] = lambda p: []
    writes: Callable[[RunPaths], list[Path]] = lambda p: []
    # a stage run once per job (a rule with wildcards): the jobs a config asks for, each
    # {wildcard: value}; its function, reads and writes then take a job's values as keywords
    jobs: Callable[[dict], list[dict[str, str]]] | None = None
    # what it writes besides `writes` under a config (ablate_decompose: the gradients' table
    # unless ablate.parallel_jobs is true, when no ablate_gradient_run job makes it)
    config_writes: Callable[[RunPaths, dict], list[Path]] = lambda p, cfg: []


# the stages whose rules take Snakemake's `gpu_jobs` (tests/test_stage_registry.py holds the
# two together): on a machine of several GPUs each claims one (ratchet/gpu_claim.py)
GPU_STAGES = ("build_engine", "eval_baseline", "bench", "train_colocated", "train_split",
              "eval_after_colocated", "eval_after_split", "verify", "ablate_decompose",
              "ablate_gradient_run", "ablate_decompose_vllm", "ablate_fix_run", "ablate_learning_run")


def gpus_wanted(stage: str, cfg: dict) -> int:
    """The GPUs a stage's job claims: one, or what the training settings ask for (colocated
    workers, one GPU each; the split engine in a process of its own, on a second GPU)."""
    train = cfg["train"]
    split = 2 if train["split"]["engine_in"] == "process" else 1
    return {"train_colocated": train["num_workers"], "train_split": split,
            "verify": max(train["num_workers"], split)}.get(stage, 1)


def gpu_memory_wanted(stage: str, cfg: dict, jobs: list[dict[str, str] | None] | None = None) -> float:
    """The GiB a GPU stage's job waits for on its GPU (config `gpu_memory_gib`; 0: no wait):
    a job's own statement (its label, "ablate_fix_run-exact") over its stage's, the stage's
    over `default`; for several `jobs` in one process, the largest of theirs."""
    wanted = cfg.get("gpu_memory_gib") or {}
    if stage not in GPU_STAGES:
        return 0.0
    stage_own = wanted.get(stage)
    stated = float(wanted.get("default") or 0 if stage_own is None else stage_own)
    labels = [job_label(stage, job) for job in jobs or [] if job]
    return max((float(wanted[label]) if wanted.get(label) is not None else stated for label in labels),
               default=stated)


# the settings that set a GPU stage's peak memory, the likeliest lever first: a stage that runs
# out of GPU memory names them, with their values (ratchet/gpu_oom.py)
_TRAINER_KNOBS = ("train.micro_batch_tokens", "train.micro_batch_size")
_ABLATION_KNOBS = ("ablate.micro_batch_tokens", "ablate.micro_batch_size")
_ENGINE_KNOBS = ("engine.max_batch_size", "engine.max_seq_len")


def memory_knobs(stage: str) -> tuple[str, ...]:
    """The config keys that set a GPU stage's peak GPU memory (none for a stage off the GPU)."""
    if stage not in GPU_STAGES:
        return ()
    if stage == "ablate_decompose_vllm":
        return ("engine.vllm.gpu_memory_utilization", *_ABLATION_KNOBS)
    if stage.startswith("ablate_"):
        return _ABLATION_KNOBS
    if stage in ("train_colocated", "train_split", "verify"):
        return _TRAINER_KNOBS
    return _ENGINE_KNOBS


def _trained(mode: str) -> Callable[[RunPaths], list[Path]]:
    return lambda p: [p.train_metrics(mode), p.train_trace(mode), p.train_summary(mode), p.train_manifest(mode)]


def _prepared(p: RunPaths) -> list[Path]:
    return [p.build, p.train_data, p.test_data]


def _gradient_jobs(cfg: dict) -> list[dict[str, str]]:
    """The gradients' parts of one dtype each; none unless ablate.parallel_jobs is true (the one part
    `all` is ablate_decompose's)."""
    from ratchet.mismatch.ablation import EVERY, gradient_parts

    return [{"dtype": d} for d in gradient_parts(cfg["ablate"]) if d != EVERY]


def _gradient_in_decompose(p: RunPaths, cfg: dict) -> list[Path]:
    from ratchet.mismatch.ablation import EVERY, gradient_parts

    return [p.gradient_part(d) for d in gradient_parts(cfg["ablate"]) if d == EVERY]


def _fix_jobs(cfg: dict) -> list[dict[str, str]]:
    from ratchet.mismatch.ablation import fix_jobs

    return [{"remedy": r} for r in fix_jobs(cfg["ablate"])]


def _learning_jobs(cfg: dict) -> list[dict[str, str]]:
    from ratchet.mismatch.learning import LearningSettings

    return LearningSettings.from_config(cfg).jobs()


STAGES: dict[str, Stage] = {
    "download_model": Stage("ratchet.stages.download_model", ("model",),
                            "fetch or make the source model and record where it is",
                            writes=lambda p: [p.source_done]),
    "download_data": Stage("ratchet.stages.download_data", ("data",),
                           "the task's train and test splits as parquet",
                           writes=lambda p: [p.train_data, p.test_data]),
    "convert_weights": Stage("ratchet.stages.convert_weights", ("model", "convert", "engine"),
                             "the source model in the engine layout and dtype, with a manifest",
                             reads=lambda p: [p.source_done], writes=lambda p: [p.manifest]),
    "build_engine": Stage("ratchet.stages.build_engine", ("engine",),
                          "pick the backend, compile and self-test the kernels, check engine against trainer",
                          reads=lambda p: [p.manifest], writes=lambda p: [p.build]),
    "eval_baseline": Stage("ratchet.stages.eval_baseline", ("data", "engine", "eval"),
                           "greedy accuracy of the converted model on the test split",
                           reads=lambda p: [p.build, p.test_data],
                           writes=lambda p: [p.eval_json("baseline"), p.eval_answers("baseline")]),
    "bench": Stage("ratchet.stages.bench", ("engine",),
                   "the CUDA engine's speed beside its references (not part of `all`)",
                   reads=lambda p: [p.build], writes=lambda p: [p.bench]),
    "ablate_decompose": Stage("ratchet.stages.ablate", ("data", "engine", "ablate", "train"),
                              "the gap by source along one GRPO run and the visibility of its updates "
                              "(and unless ablate.parallel_jobs is true, the remedies' gradients along it)",
                              reads=_prepared,
                              writes=lambda p: [p.decompose_table, p.decompose_figure,
                                                p.visibility_table, p.visibility_figure],
                              config_writes=_gradient_in_decompose),
    "ablate_gradient_run": Stage("ratchet.stages.ablate", ("data", "engine", "ablate", "train"),
                                 "each remedy's policy gradient against the on-policy one along "
                                 "ablate_decompose's GRPO run, on one engine dtype's fresh batches",
                                 reads=lambda p, dtype: _prepared(p),
                                 writes=lambda p, dtype: [p.gradient_part(dtype)], jobs=_gradient_jobs),
    "ablate_gradient": Stage("ratchet.stages.ablate", ("ablate",),
                             "ablate_gradient_run's engine dtypes as one table, and its figure",
                             writes=lambda p: [p.gradient_table, p.gradient_figure]),
    "ablate_decompose_vllm": Stage("ratchet.stages.ablate", ("data", "engine", "ablate", "train"),
                                   "the gap by source on ratchet's engine and on vLLM, the same masters "
                                   "along one GRPO run (needs vLLM and a GPU; not part of `all`)",
                                   reads=_prepared,
                                   writes=lambda p: [p.decompose_vllm_table, p.decompose_vllm_figure]),
    "ablate_fix_run": Stage("ratchet.stages.ablate", ("data", "engine", "eval", "ablate", "train"),
                            "one GRPO run of ablate_fix (no correction, the fix, the exact fix, TIS "
                            "or MIS) from the ablations' seeds, scored after training",
                            reads=lambda p, remedy: _prepared(p),
                            writes=lambda p, remedy: [p.fix_run_steps(remedy), p.fix_run_summary(remedy)],
                            jobs=_fix_jobs),
    "ablate_fix": Stage("ratchet.stages.ablate", ("ablate",),
                        "ablate_fix_run's runs side by side: the fix and the exact fix against TIS and MIS",
                        writes=lambda p: [p.fix_table, p.fix_steps, p.fix_figure]),
    "ablate_learning_run": Stage("ratchet.stages.learning", ("data", "engine", "eval", "ablate", "train"),
                                 "one GRPO run of ablate_learning (an engine dtype and a remedy), "
                                 "scored on the test problems as it learns",
                                 reads=lambda p, dtype, remedy: _prepared(p),
                                 writes=lambda p, dtype, remedy: [p.learning_steps(dtype, remedy),
                                                                  p.learning_answers(dtype, remedy)],
                                 jobs=_learning_jobs),
    "ablate_learning": Stage("ratchet.stages.learning", ("ablate",),
                             "ablate_learning's runs side by side: paired gains and differences "
                             "with standard errors, which are established (not part of `all`)",
                             writes=lambda p: [p.learning_table, p.learning_diffs, p.learning_curves,
                                               p.learning_figure, p.learning_summary]),
    **{f"train_{m}": Stage("ratchet.stages.train", ("data", "engine", "eval", "train"),
                           f"GRPO training, {m} mode (resumes from its newest checkpoint)",
                           reads=_prepared, writes=_trained(m)) for m in MODES},
    **{f"eval_after_{m}": Stage("ratchet.stages.train", ("data", "engine", "eval"),
                                f"greedy accuracy of the {m} training's weights",
                                reads=lambda p, m=m: [p.train_manifest(m), p.test_data],
                                writes=lambda p, m=m: [p.eval_json(f"after_{m}"), p.eval_answers(f"after_{m}")])
       for m in MODES},
    **{f"export_{m}": Stage("ratchet.stages.export", ("model",),
                            f"the {m} training's weights in the Hugging Face format",
                            reads=lambda p, m=m: [p.train_manifest(m), p.source_done],
                            writes=lambda p, m=m: [p.export_record(m), p.export_dir(m) / "model.safetensors"])
       for m in MODES},
    "verify": Stage("ratchet.stages.verify", ("data", "engine", "eval", "train"),
                    "rerun the first steps of each training mode and compare them bit for bit",
                    reads=lambda p: [p.train_trace(m) for m in MODES], writes=lambda p: [p.verify_json]),
    "report": Stage("ratchet.stages.report", ("engine", "ablate"),
                    "every table and figure of the run, and the ablations' headline numbers",
                    reads=lambda p: [p.eval_json("baseline"), p.decompose_table, p.visibility_table, p.fix_table,
                                     p.gradient_table],
                    writes=lambda p: [p.report_summary, p.report_summary_html, p.report_training_figure,
                                      p.ablate_summary]),
}


def settings(stage: str, cfg: dict) -> dict:
    """The part of the config a stage depends on."""
    return {k: cfg[k] for k in COMMON + STAGES[stage].sections}


def job_label(stage: str, job: dict[str, str] | None = None) -> str:
    """A stage's name in stamps, logs and MLflow, with a job's values: ablate_learning_run-bf16-tis."""
    return "-".join([stage, *(job or {}).values()])


def stage_jobs(stage: str, cfg: dict) -> list[dict[str, str] | None]:
    """The jobs of `stage` under `cfg`: [None] for a stage run once."""
    s = STAGES[stage]
    return [None] if s.jobs is None else s.jobs(cfg)


def reads(stage: str, paths: RunPaths, job: dict[str, str] | None = None) -> list[Path]:
    return STAGES[stage].reads(paths, **(job or {}))


def writes(stage: str, paths: RunPaths, job: dict[str, str] | None = None, cfg: dict | None = None) -> list[Path]:
    """What a stage (one job of it) writes; with `cfg`, also what it writes only under that config."""
    s = STAGES[stage]
    return s.writes(paths, **(job or {})) + (s.config_writes(paths, cfg) if cfg is not None else [])


def producer(path: Path, paths: RunPaths, cfg: dict | None = None) -> str | None:
    """The stage that writes `path`, if any; stages run per job are only searched when `cfg`
    says which jobs there are."""
    for name, s in STAGES.items():
        for job in ([None] if s.jobs is None else s.jobs(cfg) if cfg is not None else []):
            if Path(path) in writes(name, paths, job, cfg):
                return name
    return None
