"""report (`ratchet report`): summary.md with every table of the run, from whatever the other
stages have written so far ("not run" where missing, so it can be rebuilt mid-training); it
draws the training curves and writes the ablations' records from their tables."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ratchet.atomic import write_json, write_text
from ratchet.paths import RunPaths
from ratchet.report.tables import TRAIN_MODES


def training_paths(paths: RunPaths) -> list[Path]:
    """Every training output the report reads (the Snakemake rule waits for those a rule of
    the workflow makes)."""
    return [p for m in TRAIN_MODES for p in (paths.eval_json(f"after_{m}"), paths.train_metrics(m))] \
        + [paths.verify_json]


def training_inputs(paths: RunPaths, rules) -> list[str]:
    """The training outputs the report reads that one of `rules` (Snakemake's) makes: the
    report rule waits for those, and says "not run" for any other that is missing."""
    wanted = {str(p) for p in training_paths(paths)}
    return sorted(wanted & {str(f) for r in rules for f in r.output})


# stages run on demand, outside the default DAG: the report reads their outputs where they are,
# so it checks itself that they were made under the settings it reports
ON_DEMAND = ("ablate_decompose_vllm", "ablate_learning")


def made_here(paths: RunPaths, cfg: dict, stage: str) -> bool:
    """Whether `stage`'s outputs, if any, were made under `cfg`'s settings (else they are left
    out of the report, saying why, rather than shown as this run's)."""
    from ratchet.stages.guard import changed_settings

    diff = changed_settings(paths, stage, None, cfg)
    if diff:
        print(f"[report] {stage}'s outputs were made under other settings ({diff}): left out; "
              f"rerun `snakemake {stage}` to include them", flush=True)
    return diff is None


def _json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _parquet(path: Path):
    import pandas as pd

    return pd.read_parquet(path) if path.is_file() else None


def gather(cfg: dict):
    """ReportInputs from results/<run>/, None for each output not there (yet)."""
    from ratchet.report.record import paired_gains
    from ratchet.report.summary import ReportInputs

    paths = RunPaths.from_config(cfg)
    rel = lambda p: os.path.relpath(p, paths.report)  # noqa: E731  links from summary.md
    build = _json(paths.build)
    engine = f"{build['backend']}, {build['dtype']}" if build else cfg["engine"]["dtype"]
    vllm, learning = (made_here(paths, cfg, stage) for stage in ON_DEMAND)
    figures = {name: rel(p) if p.is_file() and fresh else None for name, p, fresh in
               [("decompose", paths.decompose_figure, True), ("decompose_vllm", paths.decompose_vllm_figure, vllm),
                ("visibility", paths.visibility_figure, True),
                ("fix", paths.fix_figure, True), ("gradient", paths.gradient_figure, True),
                ("learning", paths.learning_figure, learning)]}
    return ReportInputs(
        run_name=cfg["run_name"], engine=engine,
        baseline=_json(paths.eval_json("baseline")),
        after={m: _json(paths.eval_json(f"after_{m}")) for m in TRAIN_MODES},
        gains=paired_gains(paths),
        train={m: _parquet(paths.train_metrics(m)) for m in TRAIN_MODES},
        verify=_json(paths.verify_json),
        decompose=_parquet(paths.decompose_table), visibility=_parquet(paths.visibility_table),
        decompose_vllm=_parquet(paths.decompose_vllm_table) if vllm else None,
        fix_steps=_parquet(paths.fix_steps), fix_runs=_parquet(paths.fix_table),
        gradient=_parquet(paths.gradient_table),
        learning_runs=_parquet(paths.learning_table) if learning else None,
        learning_diffs=_parquet(paths.learning_diffs) if learning else None,
        ablate_summary=_json(paths.ablate_summary), ablate_settings=dict(cfg["ablate"]),
        figures=figures)


def write_ablation_records(cfg: dict, inputs, run) -> dict:
    """ablate/summary.json: the ablations' headline numbers, from their tables."""
    from ratchet.mismatch.ablation import AblateSettings
    from ratchet.stages.ablate import records

    paths = RunPaths.from_config(cfg)
    record = records(AblateSettings.from_config(cfg), inputs.decompose, inputs.visibility,
                     inputs.fix_runs, inputs.gradient)
    build = _json(paths.build)
    record.update({"run_name": cfg["run_name"], "backend": build["backend"] if build else None})
    if inputs.learning_runs is not None:  # ablate_learning's, where it ran under these settings
        record.update(_json(paths.learning_summary) or {})
    write_json(paths.ablate_summary, record)
    print("[report] ablation records: " + json.dumps(record), flush=True)
    run.log_metrics({f"ablate/{k}": v for k, v in record.items()
                     if isinstance(v, (int, float)) and not isinstance(v, bool)})
    run.log_output(paths.ablate_summary)
    return record


def summary_html(markdown_text: str, run_name: str) -> str:
    """The summary as a page, so that `snakemake --report` shows its tables instead of offering
    a Markdown file to download."""
    import markdown

    body = markdown.markdown(markdown_text, extensions=["tables"])
    style = ("body{font-family:sans-serif;max-width:72em;margin:1em auto}table{border-collapse:collapse;"
             "margin:.5em 0}td,th{border:1px solid #ccc;padding:.2em .5em;text-align:right}"
             "th{background:#f3f3f3}img{max-width:100%}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>ratchet {run_name}</title>"
            f"<style>{style}</style></head><body>{body}</body></html>\n")


def report(cfg: dict, run) -> None:
    from ratchet.report.figures import training_figure
    from ratchet.report.summary import build_summary

    paths = RunPaths.from_config(cfg)
    inputs = gather(cfg)
    records = write_ablation_records(cfg, inputs, run)
    if any(t is not None for t in (inputs.decompose, inputs.visibility, inputs.fix_runs, inputs.gradient)):
        inputs.ablate_summary = records
    training_figure(inputs.train, paths.report_training_figure)
    inputs.figures["training"] = os.path.relpath(paths.report_training_figure, paths.report)
    text = build_summary(inputs)
    write_text(paths.report_summary, text + "\n")
    write_text(paths.report_summary_html, summary_html(text, cfg["run_name"]))
    missing = [name for name, v in [("baseline", inputs.baseline),
                                    *[(f"after {m}", e) for m, e in inputs.after.items()],
                                    *[(f"train {m}", d) for m, d in inputs.train.items()],
                                    ("verify", inputs.verify),
                                    ("decompose", inputs.decompose), ("visibility", inputs.visibility),
                                    ("fix", inputs.fix_runs), ("gradient", inputs.gradient)] if v is None]
    print(f"[report] {paths.report_summary}" + (f" (not run yet: {', '.join(missing)})" if missing else ""))
    run.set_tags({"report.not_run": ",".join(missing) or "none"})
    run.log_output(paths.report_summary)
    run.log_output(paths.report_summary_html)
    run.log_output(paths.report_training_figure)
    for name in ("decompose", "visibility", "fix", "gradient", "learning"):
        figure = getattr(paths, f"{name}_figure")
        if figure.is_file():
            run.log_output(figure)
