"""What keeps a stage run by hand from corrupting a pipeline's results: its inputs must exist
(else the rule that makes them is named), it must not overwrite outputs made under other
settings (unless forced), and no two processes write one run directory at once."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path

from ratchet.atomic import write_json
from ratchet.errors import InputError, MissingInputError
from ratchet.paths import RunPaths
from ratchet.stages.registry import job_label, producer, reads, settings, writes
from ratchet.tracking import flatten


def stamp_path(paths: RunPaths, stage: str) -> Path:
    return paths.root / ".stamps" / f"{stage}.json"


def write_stamp(stage: str, cfg: dict, job: dict | None = None) -> None:
    """After a stage (or one job of it) succeeds: the settings its outputs were made under."""
    write_json(stamp_path(RunPaths.from_config(cfg), job_label(stage, job)), {"settings": settings(stage, cfg)})


def check_inputs(stage: str, cfg: dict, job: dict | None = None) -> None:
    paths = RunPaths.from_config(cfg)
    missing = [p for p in reads(stage, paths, job) if not p.exists()]
    if missing:
        rule = producer(missing[0], paths, cfg)
        how = f"run `snakemake {rule}` (or `ratchet {rule}`) first" if rule else "it is made outside the pipeline"
        raise MissingInputError(f"{stage}: input {missing[0]} does not exist; {how}")


def check_overwrite(stage: str, cfg: dict, job: dict | None = None) -> None:
    """Refuse to replace outputs that were made under other settings; name the keys that differ."""
    paths = RunPaths.from_config(cfg)
    existing = [p for p in writes(stage, paths, job, cfg) if p.exists()]
    diff = changed_settings(paths, stage, job, cfg) if existing else None
    if diff:
        raise InputError(f"{stage}: {existing[0]} was made under other settings ({diff}); "
                         "rerun it through snakemake, write elsewhere (results_dir=...), or pass --force")


def changed_settings(paths: RunPaths, stage: str, job: dict | None, cfg: dict, ignore=()) -> str | None:
    """The first keys (`before -> now`) where the settings `stage`'s outputs were stamped with
    differ from `cfg`'s, leaving out the keys in `ignore` and those under them; None where
    they agree or there is no stamp."""
    stamp = stamp_path(paths, job_label(stage, job))
    if not stamp.is_file():
        return None
    before, now = flatten(json.loads(stamp.read_text())["settings"]), flatten(settings(stage, cfg))
    changed = sorted(k for k in before.keys() | now.keys() if before.get(k) != now.get(k)
                     and not any(k == i or k.startswith(f"{i}.") for i in ignore))
    return ", ".join(f"{k}: {before.get(k)} -> {now.get(k)}" for k in changed[:4]) or None


@contextlib.contextmanager
def run_directory_lock(cfg: dict, exclusive: bool):
    """Pipeline jobs share the run directory (exclusive=False); a stage run by hand holds it
    alone and is refused at once while anything else writes there."""
    root = RunPaths.from_config(cfg).root
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / ".write.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InputError(f"{root} is being written by another process (a pipeline, or a stage "
                             "run by hand); wait for it, or write elsewhere (results_dir=...)") from None
        yield
    finally:
        os.close(fd)
