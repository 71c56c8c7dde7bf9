"""Dataset splits on disk: one parquet file per split, checked on the way in and out.

A split is a DataFrame with columns `id` (int, unique), `question`, `answer` (the reference
solution) and `target` (the final number, as a string); extra columns are kept.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from ratchet.errors import InputError, MissingInputError

COLUMNS = ("id", "question", "answer", "target")


def check_split(df: pd.DataFrame, source: str) -> pd.DataFrame:
    """Raise one ValueError naming `source` unless `df` is a usable split; return it typed."""
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise InputError(f"{source}: missing column(s) {missing} (a split needs {list(COLUMNS)})")
    if len(df) == 0:
        raise InputError(f"{source}: the split is empty")
    for column in COLUMNS:
        nulls = df[column].isna()
        if nulls.any():
            raise InputError(f"{source}: column {column!r} is empty in row {int(nulls.idxmax())}")
    if not pd.api.types.is_integer_dtype(df["id"]):
        raise InputError(f"{source}: column 'id' must hold integers, got {df['id'].dtype}")
    if df["id"].duplicated().any():
        raise InputError(f"{source}: id {int(df['id'][df['id'].duplicated()].iloc[0])} repeats")
    df = df.reset_index(drop=True)
    for column in COLUMNS[1:]:
        df[column] = df[column].astype(str)
    df["id"] = df["id"].astype("int64")
    return df


def save_split(df: pd.DataFrame, path: str | Path) -> Path:
    """Check `df`, write it as parquet under a temporary name, then rename into place."""
    path = Path(path)
    df = check_split(df, str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        df.to_parquet(tmp, index=False)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def load_split(path: str | Path) -> pd.DataFrame:
    """Read a split written by `save_split`; ValueError naming the file if it is not one."""
    path = Path(path)
    if not path.is_file():
        raise MissingInputError(f"dataset split {path} not found")
    try:
        df = pd.read_parquet(path)
    except Exception as exc:  # pyarrow raises several types for a file that is not parquet
        raise InputError(f"{path}: not a readable parquet file: {exc}") from None
    return check_split(df, str(path))
