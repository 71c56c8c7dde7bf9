"""`ratchet <stage> [--config FILE] [key=value ...]`: run one pipeline stage by hand.
The Snakemake rules call this same entry point, so a stage behaves the same in and out of it;
`ratchet config ...` prints the config a profile resolves to."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ratchet import config as config_mod
from ratchet.errors import InputError
from ratchet.paths import RunPaths
from ratchet.stages import CONFIG_ENV, STAGES, claim_gpus_for, run_stage
from ratchet.stages.registry import COMMON

# stages that only fetch, convert or tabulate: no engine or trainer, so any machine will do
# (ablate_learning compares runs made on GPUs, possibly in different sessions, on a CPU too)
NO_ENGINE = ("download_model", "download_data", "convert_weights", "report", "ablate_learning")
TEMPLATE = RunPaths(Path("<results_dir>"), "<run_name>")


def _stage_help(name: str) -> str:
    s = STAGES[name]
    job = _template_job(name)
    reads = "\n".join(f"  {p}" for p in s.reads(TEMPLATE, **job)) or "  (nothing from earlier stages)"
    writes = "\n".join(f"  {p}" for p in s.writes(TEMPLATE, **job))
    if job:
        writes += "\nonce per job (--job " + " --job ".join(f"{k}=..." for k in job) + "; all of the " \
                  "config's jobs without it)"
    sections = ", ".join(COMMON + s.sections)
    target = s.writes(TEMPLATE, **job)[0] if job else name  # a rule with wildcards: a file of one job
    return (f"{name}: {s.summary}.\n\nreads:\n{reads}\nwrites:\n{writes}\nconfig it depends on: "
            f"{sections}\n\nAs a rule of the pipeline: snakemake --cores all {target}")


def _template_job(name: str) -> dict[str, str]:
    """A job stage's wildcards as placeholders (<dtype>), for its help."""
    from ratchet.config import validate

    if STAGES[name].jobs is None:
        return {}
    return {k: f"<{k}>" for k in STAGES[name].jobs(validate({}))[0]}


def _jobs(stage: str, cfg: dict, given: list[str]) -> list[dict[str, str] | None]:
    """The jobs to run: the one `--job key=value ...` names, or every job the config asks for."""
    from ratchet.stages.registry import stage_jobs

    jobs = stage_jobs(stage, cfg)
    if not jobs:  # e.g. ablate_gradient_run unless ablate.parallel_jobs is true (ablate_decompose does its work)
        raise InputError(f"{stage}: the config asks for no job of it")
    if not given:
        return jobs
    pairs = [g.split("=", 1) for g in given]
    if any(len(p) != 2 for p in pairs):
        raise InputError(f"{stage}: --job takes key=value, got {given}")
    job = dict(pairs)
    match = [j for j in jobs if j == job]
    if not match:
        listed = ", ".join(" ".join(f"{k}={v}" for k, v in j.items()) for j in jobs)
        raise InputError(f"{stage}: job {' '.join(given)} is not one the config asks for ({listed})")
    return match


def _overview() -> str:
    lines = ["ratchet: run one stage of the mismatch pipeline by hand, or print a resolved config.", "",
             "usage: ratchet <stage> [--config FILE] [--force] [key=value ...]",
             "       ratchet config [--config FILE] [key=value ...]", "", "stages (in pipeline order):"]
    lines += [f"  {n:22s} {s.summary}" for n, s in STAGES.items()]
    lines += ["", "`ratchet <stage> --help` says what a stage reads, writes and depends on."]
    return "\n".join(lines)


def _parser(name: str) -> argparse.ArgumentParser:
    about = _stage_help(name) if name in STAGES else "print the config a profile resolves to, as JSON"
    p = argparse.ArgumentParser(prog=f"ratchet {name}", description=about,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="YAML profile laid over the schema's defaults (default: the "
                                    "defaults alone)")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="override a config key, e.g. eval.num_problems=50")
    # the rules: the validated config through the environment, progress to their fd 3
    p.add_argument("--config-from-env", action="store_true", help=argparse.SUPPRESS)
    if name in STAGES:
        p.add_argument("--force", action="store_true", help="replace outputs made under other settings")
        p.add_argument("--progress-fd", type=int, help=argparse.SUPPRESS)
        if STAGES[name].jobs is not None:
            p.add_argument("--job", action="append", default=[], metavar="key=value",
                           help="run this one job (every value named); default: every job of the config")
    else:
        p.add_argument("--out", help="write it to this file (through a temporary name) instead")
    return p


def _config(args) -> dict:
    if getattr(args, "config_from_env", False):
        return config_mod.validate(config_mod.apply_overrides(json.loads(os.environ[CONFIG_ENV]),
                                                              args.overrides))
    return config_mod.load(args.config, args.overrides)


def _preflight(stage: str, cfg: dict) -> None:
    """What the pipeline checks once at its start, checked for a stage run by hand."""
    from ratchet import tracking
    from ratchet.device import resolve_backend
    from ratchet.preflight import check_device

    if stage not in NO_ENGINE:
        check_device(cfg, resolve_backend(cfg["engine"]["backend"]))
    if tracking.enabled():
        from ratchet.tracking_store import check_store

        check_store(tracking.tracking_uri(Path(cfg["results_dir"])))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_overview())
        return 0
    name = argv[0]
    if name not in STAGES and name != "config":
        print(f"ratchet: unknown stage {name!r}\n\n{_overview()}", file=sys.stderr)
        return 2
    args = _parser(name).parse_intermixed_args(argv[1:])  # overrides before or after --config
    args.stage = name
    cfg = jobs = None
    try:
        cfg = _config(args)
        if not getattr(args, "config_from_env", False):  # a pipeline's rule: its Snakefile checked them
            from ratchet.preflight import check_settings

            check_settings(cfg)  # a bad pair of keys names them before any work, as in the pipeline
        if args.stage == "config":
            text = json.dumps(cfg, indent=2, sort_keys=True) + "\n"
            if args.out:
                from ratchet.atomic import write_text

                if Path(args.out).is_dir():
                    raise InputError(f"config --out {args.out}: is a directory (give a file's path)")
                write_text(Path(args.out), text)
            else:
                print(text, end="")
            return 0
        if getattr(args, "progress_fd", None) is not None:
            from ratchet.progress import set_console_fd

            set_console_fd(args.progress_fd)
        jobs = _jobs(args.stage, cfg, getattr(args, "job", []))
        claim_gpus_for(args.stage, cfg, jobs)  # before the preflight's device check starts CUDA
        if not args.config_from_env:
            _preflight(args.stage, cfg)
        for job in jobs:
            run_stage(args.stage, cfg, by_hand=not args.config_from_env, force=args.force, job=job)
    except InputError as e:  # bad config, data, model files, a missing input, the store: one line
        print(f"ratchet: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # the GPU's memory run out: one line naming the settings to change
        from ratchet.gpu_oom import is_gpu_oom, oom_message

        if cfg is None or not is_gpu_oom(e):
            raise
        print(f"ratchet: {oom_message(args.stage, cfg, e, jobs)}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
