"""ablate_learning_run (one job per engine dtype and remedy, so a GPU runs several at once) and
ablate_learning (their runs side by side): read the inputs, run ratchet/mismatch/learning.py,
write results/<run>/ablate/learning/ and ablate/learning*, and track."""

from __future__ import annotations

import json
import time

import numpy as np
import pandas as pd

from ratchet.atomic import write_json, write_parquet
from ratchet.paths import RunPaths
from ratchet.progress import Progress
from ratchet.stages.ablate import FIX_METRICS, read_part
from ratchet.stages.registry import writes


def learning_setup(cfg: dict):
    """(Setup, AblateSettings, LearningSettings): ablate's setup, its eval set the first
    ablate.learning.eval_problems test problems (null: all of them, 1,319 for GSM8K)."""
    from ratchet.data.datasets_io import load_split
    from ratchet.mismatch.learning import LearningSettings
    from ratchet.stages.ablate import make_setup

    learning = LearningSettings.from_config(cfg)
    setup, settings = make_setup(cfg, with_eval=True)
    test = load_split(RunPaths.from_config(cfg).test_data)
    setup.eval_problems = test.head(learning.eval_problems) if learning.eval_problems else test
    return setup, settings, learning


def ablate_learning_run(cfg: dict, run, dtype: str, remedy: str) -> None:
    from ratchet.mismatch.ablation import FIX_RUNS
    from ratchet.mismatch.learning import check_job, learning_run

    paths = RunPaths.from_config(cfg)
    setup, settings, learning = learning_setup(cfg)
    check_job(learning, dtype, remedy)
    name = f"{dtype}-{remedy}"
    print(f"[ablate_learning] {name}: {learning.steps} steps, eval at {learning.eval_steps()} on "
          f"{len(setup.eval_problems)} test problems", flush=True)
    start = time.perf_counter()
    progress = Progress(f"ablate_learning {name}", learning.steps)
    variant = run.variant(name, {"engine_dtype": dtype, "remedy": remedy, **FIX_RUNS[remedy]})

    def log(step, row):
        variant.log_metrics({FIX_METRICS[k]: v for k, v in row.items()
                             if k in FIX_METRICS and np.isfinite(v)}, step=step)
        progress.update(step + 1, f"reward {row['reward']:.3f}")

    def log_eval(step, accuracy):
        variant.log_metrics({"eval/accuracy": accuracy}, step=step)
        print(f"[ablate_learning] {name} step {step}: accuracy {accuracy:.4f}", flush=True)

    steps, answers = learning_run(setup, settings, learning, dtype, remedy, log=log, log_eval=log_eval)
    write_parquet(paths.learning_steps(dtype, remedy), steps)
    write_parquet(paths.learning_answers(dtype, remedy), answers)
    run.log_metrics({"time/learning_run_s": time.perf_counter() - start})
    for path in (paths.learning_steps(dtype, remedy), paths.learning_answers(dtype, remedy)):
        run.log_output(path)


def read_runs(cfg: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every run's (steps, answers) the config asks for, concatenated; a missing one is named
    with the command that makes it."""
    from ratchet.mismatch.learning import LearningSettings

    paths = RunPaths.from_config(cfg)
    steps, answers = [], []
    for job in LearningSettings.from_config(cfg).jobs():
        makes = f"ablate_learning_run --job dtype={job['dtype']} --job remedy={job['remedy']}"
        for path, into in ((paths.learning_steps(**job), steps), (paths.learning_answers(**job), answers)):
            into.append(read_part(path, "ablate_learning", makes))
    return pd.concat(steps, ignore_index=True), pd.concat(answers, ignore_index=True)


def ablate_learning(cfg: dict, run) -> None:
    from ratchet.mismatch.learning import LearningSettings

    paths = RunPaths.from_config(cfg)
    steps, answers = read_runs(cfg)
    summary = write_comparison(paths, LearningSettings.from_config(cfg), steps, answers)
    run.log_metrics({f"ablate/{k}": v for k, v in summary.items()
                     if isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)})
    for path in writes("ablate_learning", paths):
        run.log_output(path)


def write_comparison(paths: RunPaths, learning, steps: pd.DataFrame, answers: pd.DataFrame) -> dict:
    """The runs side by side (run table, paired differences, accuracy curves, figure, summary)
    under paths.ablate; also what dev/learning_record.py calls on runs from several sessions."""
    from ratchet.mismatch.learning import (
        accuracy_curve,
        difference_table,
        pooled_difference_table,
        record,
        run_table,
    )
    from ratchet.report.figures import learning_figure

    runs, diffs, curves = run_table(steps, answers), difference_table(answers), accuracy_curve(answers)
    pooled = pooled_difference_table(answers)
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print("[ablate_learning] runs:\n" + runs.to_string(index=False), flush=True)
        print("[ablate_learning] differences after training:\n" + diffs.to_string(index=False), flush=True)
        if len(pooled):
            print("[ablate_learning] pooled over the engine dtypes (exploratory, outside Holm):\n"
                  + pooled.to_string(index=False), flush=True)
    summary = record(runs, diffs, learning, pooled)
    print("[ablate_learning] record: " + json.dumps(summary), flush=True)
    write_parquet(paths.learning_table, runs)
    write_parquet(paths.learning_diffs, diffs)
    write_parquet(paths.learning_curves, curves)
    learning_figure(steps, curves, paths.learning_figure, diffs)
    write_json(paths.learning_summary, summary)
    return summary
