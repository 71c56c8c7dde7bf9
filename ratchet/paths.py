"""The one place that knows the results/ layout: the Snakemake rules declare these paths as
their inputs and outputs and the stages write to them, so the two cannot disagree."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunPaths:
    results_dir: Path
    run_name: str

    @classmethod
    def from_config(cls, cfg: dict) -> "RunPaths":
        return cls(Path(cfg["results_dir"]), cfg["run_name"])

    @property
    def root(self) -> Path:
        return self.results_dir / self.run_name

    @property
    def mlflow_db(self) -> Path:
        return self.results_dir / "mlflow.db"

    @property
    def resolved_config(self) -> Path:
        return self.root / "config.json"

    # download_model / download_data
    @property
    def source(self) -> Path:
        return self.root / "source"

    @property
    def source_done(self) -> Path:
        return self.source / "source.json"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def train_data(self) -> Path:
        return self.data / "train.parquet"

    @property
    def test_data(self) -> Path:
        return self.data / "test.parquet"

    # convert_weights
    @property
    def model(self) -> Path:
        return self.root / "model"

    @property
    def manifest(self) -> Path:
        return self.model / "manifest.json"

    # build_engine
    @property
    def build(self) -> Path:
        return self.root / "engine" / "build.json"

    # evals
    def eval_json(self, name: str) -> Path:
        return self.root / "eval" / f"{name}.json"

    def eval_answers(self, name: str) -> Path:
        return self.root / "eval" / f"{name}_answers.parquet"

    @property
    def bench(self) -> Path:
        return self.root / "bench" / "bench.json"

    def log(self, stage: str) -> Path:
        return self.root / "logs" / f"{stage}.log"

    @property
    def benchmarks(self) -> Path:
        return self.root / "benchmarks"

    def benchmark(self, stage: str) -> Path:
        return self.benchmarks / f"{stage}.tsv"

    # ablations and report
    @property
    def ablate(self) -> Path:
        return self.root / "ablate"

    @property
    def decompose_table(self) -> Path:
        return self.ablate / "decompose.parquet"

    @property
    def decompose_figure(self) -> Path:
        return self.ablate / "decompose.png"

    @property
    def decompose_vllm_table(self) -> Path:
        return self.ablate / "decompose_vllm.parquet"

    @property
    def decompose_vllm_figure(self) -> Path:
        return self.ablate / "decompose_vllm.png"

    @property
    def visibility_table(self) -> Path:
        return self.ablate / "visibility.parquet"

    @property
    def visibility_figure(self) -> Path:
        return self.ablate / "visibility.png"

    @property
    def fix_table(self) -> Path:
        return self.ablate / "fix.parquet"

    @property
    def fix_steps(self) -> Path:
        return self.ablate / "fix_steps.parquet"

    @property
    def fix_figure(self) -> Path:
        return self.ablate / "fix.png"

    # ablate_fix_run and the gradients: a job per remedy and a part per engine dtype (or `all`)
    def fix_run_steps(self, remedy: str) -> Path:
        return self.ablate / "fix" / remedy / "steps.parquet"

    def fix_run_summary(self, remedy: str) -> Path:
        return self.ablate / "fix" / remedy / "run.parquet"

    def gradient_part(self, dtype: str) -> Path:
        return self.ablate / "gradient" / f"{dtype}.parquet"

    @property
    def gradient_table(self) -> Path:
        return self.ablate / "gradient.parquet"

    @property
    def gradient_figure(self) -> Path:
        return self.ablate / "gradient.png"

    @property
    def ablate_summary(self) -> Path:
        return self.ablate / "summary.json"

    # ablate_learning: one directory per (engine dtype, remedy) run, then the aggregate
    def learning_run_dir(self, dtype: str, remedy: str) -> Path:
        return self.ablate / "learning" / f"{dtype}-{remedy}"

    def learning_steps(self, dtype: str, remedy: str) -> Path:
        return self.learning_run_dir(dtype, remedy) / "steps.parquet"

    def learning_answers(self, dtype: str, remedy: str) -> Path:
        return self.learning_run_dir(dtype, remedy) / "answers.parquet"

    @property
    def learning_table(self) -> Path:
        return self.ablate / "learning.parquet"

    @property
    def learning_diffs(self) -> Path:
        return self.ablate / "learning_diffs.parquet"

    @property
    def learning_curves(self) -> Path:
        return self.ablate / "learning_curves.parquet"

    @property
    def learning_figure(self) -> Path:
        return self.ablate / "learning.png"

    @property
    def learning_summary(self) -> Path:
        return self.ablate / "learning_summary.json"

    @property
    def report(self) -> Path:
        return self.root / "report"

    @property
    def report_summary(self) -> Path:
        return self.report / "summary.md"

    @property
    def report_summary_html(self) -> Path:
        return self.report / "summary.html"

    @property
    def report_training_figure(self) -> Path:
        return self.report / "training.png"

    # training
    def train_dir(self, mode: str) -> Path:
        return self.root / "train" / mode

    def train_metrics(self, mode: str) -> Path:
        return self.train_dir(mode) / "metrics.parquet"

    def train_trace(self, mode: str) -> Path:
        return self.train_dir(mode) / "trace.parquet"

    def train_summary(self, mode: str) -> Path:
        return self.train_dir(mode) / "summary.json"

    def train_model(self, mode: str) -> Path:
        return self.train_dir(mode) / "model"

    def train_manifest(self, mode: str) -> Path:
        return self.train_model(mode) / "manifest.json"

    def export_dir(self, mode: str) -> Path:
        return self.root / "export" / mode

    def export_record(self, mode: str) -> Path:
        return self.root / "export" / f"{mode}.json"

    def checkpoints(self, mode: str) -> Path:
        return self.train_dir(mode) / "checkpoints"

    @property
    def verify_dir(self) -> Path:
        return self.root / "verify"

    @property
    def verify_json(self) -> Path:
        return self.verify_dir / "repro.json"
