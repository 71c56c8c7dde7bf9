"""Atomic writes: to a hidden temporary name beside the target, then renamed, so a process
killed midway never leaves a complete-looking file."""

from __future__ import annotations

import json
import os
from pathlib import Path


def _temporary(path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.with_name(f".{path.name}.tmp")


def _replace(tmp: Path, path: Path, write) -> None:
    """`write(tmp)`, then `tmp` renamed over `path`; the temporary removed if either fails."""
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str) -> None:
    _replace(_temporary(path), path, lambda tmp: tmp.write_text(text))


def write_json(path: Path, obj) -> None:
    write_text(path, json.dumps(obj, indent=2, default=float) + "\n")


def write_parquet(path: Path, frame) -> None:
    """`frame`: a DataFrame, or a list of row dicts."""
    import pandas as pd

    if not isinstance(frame, pd.DataFrame):
        frame = pd.DataFrame(frame)
    _replace(_temporary(path), path, lambda tmp: frame.to_parquet(tmp, index=False))
