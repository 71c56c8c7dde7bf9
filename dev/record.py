"""A finished run gathered into a folder to commit as a record (results/records/<name>/):
its report, metrics, evals, logs and a summary.json of the figures the README quotes.

    python -m dev.record --run results/local --out results/records/h200-local \
        --wall-s 812 --command "snakemake --cores all --configfile config/local.yaml"
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from ratchet.paths import RunPaths
from ratchet.report.record import paired_gains
from ratchet.report.tables import TRAIN_MODES
from ratchet.tracking import code_version

STEP_TIMES = ("time/generate_s", "time/train_s", "time/sync_s", "time/wait_s", "time/engine_receive_s",
              "time/step_s")
# what is copied: (pattern under the run folder, folder in the record)
COPIED = [("report/*", "report"), ("eval/*.json", "eval"), ("eval/*_answers.parquet", "eval"),
          ("engine/build.json", "engine"), ("bench/*.json", "bench"), ("benchmarks/*.tsv", "benchmarks"),
          ("verify/*.json", "verify"), ("ablate/*", "ablate"), ("logs/*.log", "logs"),
          ("train/*/metrics.parquet", "train"), ("train/*/summary.json", "train")]


def final_outputs(paths: RunPaths) -> list[Path]:
    """The outputs of `rule all` (Snakefile): all there means the run went through."""
    return [paths.eval_json("baseline"), *(paths.eval_json(f"after_{m}") for m in TRAIN_MODES),
            paths.verify_json, paths.report_summary, paths.ablate_summary]


def _json(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def training_summary(metrics: pd.DataFrame) -> dict:
    """Medians of the step times and the gap, over the training steps (not the eval rows)."""
    steps = metrics[metrics["train/loss"].notna()] if "train/loss" in metrics else metrics
    out = {"steps": int(len(steps))}
    for col in STEP_TIMES:
        if col in steps:
            out[f"median_{col.split('/')[1]}"] = float(steps[col].median())
    for col in ("mismatch/logprob_abs_diff_mean", "mismatch/logprob_abs_diff_max"):
        if col in steps:
            out[f"median_{col.split('/')[1]}"] = float(steps[col].median())
    if "train/reward" in steps and len(steps) >= 10:
        out.update(reward_tenths(steps["train/reward"].tolist()))
    return out


def reward_tenths(rewards: list[float]) -> dict[str, float]:
    """The mean reward over the first and the last tenth of the steps (at least one each)."""
    tenth = max(1, len(rewards) // 10)
    return {"reward_first_tenth": float(np.mean(rewards[:tenth])),
            "reward_last_tenth": float(np.mean(rewards[-tenth:]))}


def rule_times(benchmarks: Path) -> dict[str, float]:
    """Each rule's wall seconds from Snakemake's benchmark files."""
    return {p.stem: float(pd.read_csv(p, sep="\t")["s"].iloc[0]) for p in sorted(benchmarks.glob("*.tsv"))}


DONE = re.compile(r"^\[([\w-]+)\] done in ([\d.]+) s$", re.MULTILINE)
PEAK = re.compile(r"^\[([\w-]+)\] peak GPU memory ([\d.]+) GiB", re.MULTILINE)
# a training's step line: "[colocated] step   12  reward 0.516  ...  1.52s  |dlogp| ...  eval 0.600"
STEP = re.compile(r"^\[(?:colocated|split)\] step +(\d+) +reward ([\d.]+) .*?([\d.]+)s"
                  r"(?:  \|dlogp\| \S+)?(?:  eval ([\d.]+))?$", re.MULTILINE)


def logged_rules(logs: Path, pattern: re.Pattern = DONE) -> dict[str, float]:
    """Each finished rule's wall seconds from its log's last line: what a run cut short still
    says (Snakemake writes its benchmark files only for the rules it saw finish); with PEAK,
    each GPU rule's peak GPU memory in GiB (what config gpu_memory_gib is set from)."""
    found = {}
    for log in sorted(logs.glob("*.log")):
        match = pattern.search(log.read_text())
        if match:
            found[match.group(1)] = float(match.group(2))
    return found


def logged_training(log: Path) -> dict | None:
    """A training's summary from its log's step lines, where its metrics did not come back:
    steps, their seconds, the median step after the first, the reward over the first and last
    tenth, and the in-training evals by step."""
    steps = STEP.findall(log.read_text()) if log.is_file() else []
    if not steps:
        return None
    seconds = [float(s[2]) for s in steps]
    return {"from": "log", "steps": len(steps), "steps_s": round(sum(seconds), 3),
            "median_step_s": float(np.median(seconds[1:] or seconds)),
            **reward_tenths([float(s[1]) for s in steps]),
            "eval_by_step": {int(s[0]): float(s[3]) for s in steps if s[3]}}


def decomposition_headline(paths: RunPaths) -> dict | None:
    """What the decomposition's tables say where the ablations' summary did not come back: each
    source's largest gap per engine dtype after the most updates, the exact fix's largest gap
    over every measurement and the tokens measured, and the visibility of the first and last
    counted updates."""
    if not paths.decompose_table.is_file():
        return None
    d = pd.read_parquet(paths.decompose_table)
    last = d[d["updates"] == d["updates"].max()]
    out = {"updates": int(d["updates"].max()),
           "max_gap": {f"{r.engine_dtype}/{r.source}": float(r.abs_diff_max) for r in last.itertuples()}}
    exact = d[d["source"] == "exact"]
    if len(exact):
        out["exact_max_gap_every_measurement"] = float(exact["abs_diff_max"].max())
        out["exact_tokens_measured"] = int(exact["num_tokens"].sum())
    if paths.visibility_table.is_file():
        v = pd.read_parquet(paths.visibility_table)
        ends = sorted({1, int(v["update"].max())} & set(v["update"]))
        out["visible_share"] = {f"{r.dtype}/update{r.update}": float(r.changed_share)
                                for r in v[v["update"].isin(ends)].itertuples()}
    return out


def summarize(run: Path, wall_s: float | None = None, peak_gpu_mib: float | None = None) -> dict:
    paths = RunPaths(run.parent, run.name)
    baseline = _json(paths.eval_json("baseline"))
    verify = _json(paths.verify_json)
    build = _json(paths.build) or {}
    # a copied checkout (the GPU machine's) may carry a stale .git: the caller then names the commit
    commit, version = os.environ.get("RATCHET_COMMIT"), code_version()
    out = {"wall_s": wall_s, "commit": commit or version["git.commit"],
           "dirty": None if commit else {"true": True, "false": False}.get(version["git.dirty"]),
           "device": build.get("device"), "host": platform.node(),
           "baseline_accuracy": baseline and baseline["accuracy"],
           "baseline_accuracy_stderr": baseline and baseline["accuracy_stderr"],
           "baseline_n": baseline and baseline["n"],
           "repro_identical": verify and verify.get("identical"),
           "peak_gpu_memory_mib": peak_gpu_mib}
    gains = paired_gains(paths)
    for mode in TRAIN_MODES:
        after = _json(paths.eval_json(f"after_{mode}"))
        out[f"after_accuracy_{mode}"] = after and after["accuracy"]
        out[f"after_accuracy_stderr_{mode}"] = after and after["accuracy_stderr"]
        if mode in gains:
            out[f"gain_{mode}"] = gains[mode]
        if paths.train_metrics(mode).is_file():
            out[f"train_{mode}"] = training_summary(pd.read_parquet(paths.train_metrics(mode)))
        elif (logged := logged_training(paths.log(f"train_{mode}"))) is not None:
            out[f"train_{mode}"] = logged
        if verify and mode in verify:
            out[f"repro_identical_{mode}"] = verify[mode].get("identical")
    ablate = _json(paths.ablate_summary)
    if ablate:
        out["ablate"] = {k: v for k, v in ablate.items() if not isinstance(v, dict)}
    elif (headline := decomposition_headline(paths)) is not None:
        out["decomposition"] = headline
    if paths.benchmarks.is_dir():
        out["rule_wall_s"] = rule_times(paths.benchmarks)
    if (paths.root / "logs").is_dir():
        out["rules_done_s"] = logged_rules(paths.root / "logs")
        out["rule_gpu_peak_gib"] = logged_rules(paths.root / "logs", PEAK)
    out["complete"] = all(p.is_file() for p in final_outputs(paths))
    return out


def timeline_summary(snakemake_log: Path) -> dict:
    """From the run's Snakemake log (dev/timeline.py): each job's [start, end] in seconds from the
    first job's start, and the GPU phase: from build_engine's end to the last GPU rule's end,
    the part of the profile that the GPU's work bounds."""
    from dev.timeline import jobs
    from ratchet.stages.registry import GPU_STAGES

    found = jobs(snakemake_log.read_text().splitlines())
    out = {"timeline_s": {j.name: [j.start, j.end] for j in found}}
    built = [j.end for j in found if j.rule == "build_engine" and j.end is not None]
    ends = [j.end for j in found if j.rule in GPU_STAGES and j.rule != "build_engine" and j.end is not None]
    if built and ends:
        out["gpu_phase_s"] = {"start": built[0], "end": max(ends), "seconds": max(ends) - built[0]}
    return out


def samples(path: Path) -> list[float]:
    """The numbers of an nvidia-smi sampler's file (one a line, noheader, nounits), none where
    it is missing; anything else in it (a blank line, "[N/A]") is no sample."""
    if not path.is_file():
        return []
    return [float(v) for v in path.read_text().split() if v.replace(".", "", 1).isdigit()]


def peak_from_samples(path: Path) -> float | None:
    """The largest of nvidia-smi's memory.used samples (MiB, one per line)."""
    values = samples(path)
    return max(values) if values else None


def utilization_summary(path: Path, idle_below_pct: float = 5.0) -> dict | None:
    """nvidia-smi's utilization.gpu samples (percent, one a second): their mean, and the seconds
    in which no kernel ran for most of the sample (below `idle_below_pct`), where the profile's
    wall is not GPU work."""
    values = samples(path)
    if not values:
        return None
    return {"samples": len(values), "mean_pct": sum(values) / len(values),
            "idle_s": sum(v < idle_below_pct for v in values), "idle_below_pct": idle_below_pct}


def collect(run: Path, out: Path, wall_s: float | None = None, command: str = "",
            config: dict | None = None, gpu_samples: Path | None = None, note: str = "",
            extra: dict | None = None, snakemake_log: Path | None = None,
            gpu_util: Path | None = None) -> dict:
    """Write the record of `run` to `out` (a fresh folder: written beside it, then renamed)."""
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for pattern, dest in COPIED:
        for src in sorted(run.glob(pattern)):
            if src.is_file():
                rel = src.relative_to(run / Path(pattern).parts[0])
                target = tmp / dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, target)
    summary = summarize(run, wall_s, peak_from_samples(gpu_samples) if gpu_samples else None)
    summary["command"] = command
    if snakemake_log is not None and snakemake_log.is_file():  # when each job ran, and the GPU phase
        summary.update(timeline_summary(snakemake_log))
        shutil.copy2(snakemake_log, tmp / "snakemake.log")
    summary.update(extra or {})  # what the run's files cannot say (a machine, an observed figure)
    if note:
        summary["record_note"] = note
    if gpu_samples is not None and gpu_samples.is_file():  # the memory timeline, one sample a second
        shutil.copy2(gpu_samples, tmp / "gpu_memory_used_mib.txt")
    if gpu_util is not None and gpu_util.is_file():  # how busy the GPU was, one sample a second
        summary["gpu_utilization"] = utilization_summary(gpu_util)
        shutil.copy2(gpu_util, tmp / "gpu_utilization_pct.txt")
    if config is not None:
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (tmp / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return summary


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="the run folder, e.g. results/local")
    parser.add_argument("--out", type=Path, required=True, help="the record folder to write")
    parser.add_argument("--wall-s", type=float, default=None, help="the pipeline's wall time")
    parser.add_argument("--command", default="", help="the command that made the run")
    parser.add_argument("--config", type=Path, default=None, help="the config file of the run")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="the run's overrides of --config (snakemake's set=), so config.json is what ran")
    parser.add_argument("--note", default="", help="what the record lacks and why (a run cut short)")
    parser.add_argument("--extra", type=json.loads, default=None, metavar="JSON",
                        help="fields the run's files cannot give, e.g. '{\"device\": \"NVIDIA H200\"}'")
    parser.add_argument("--snakemake-log", type=Path, default=None,
                        help="the run's Snakemake log: each job's start and end, and the GPU phase")
    parser.add_argument("--gpu-samples", type=Path, default=None,
                        help="nvidia-smi memory.used samples (MiB per line) taken during the run")
    parser.add_argument("--gpu-util", type=Path, default=None,
                        help="nvidia-smi utilization.gpu samples (percent per line) taken during the run")
    args = parser.parse_args(argv)
    if not args.run.is_dir():
        parser.error(f"--run {args.run}: no such run folder")
    config = None
    if args.config is not None:
        from ratchet import config as config_mod

        config = config_mod.load(args.config, args.set)
    summary = collect(args.run, args.out, args.wall_s, args.command, config, args.gpu_samples, args.note,
                      args.extra, args.snakemake_log, args.gpu_util)
    print(json.dumps({k: v for k, v in summary.items() if not isinstance(v, dict)}, indent=2))


if __name__ == "__main__":
    main()
