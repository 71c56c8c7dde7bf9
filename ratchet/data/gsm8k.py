"""GSM8K as split DataFrames (id, question, answer, target), from the hub or from local files.

The hub path goes through `datasets.load_dataset` at a pinned revision, so it also runs offline
from a warm Hugging Face cache (HF_HUB_OFFLINE=1, HF_DATASETS_OFFLINE=1). The local path reads
the same records from .jsonl or .parquet. `target` is the text after the last '####' with the
thousands commas removed ("1,600" -> "1600"); every row is checked and a bad one is named by
file and line (jsonl) or row (parquet, hub).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ratchet.data.datasets_io import check_split
from ratchet.data.reward import to_fraction
from ratchet.errors import InputError, MissingInputError, SourceUnavailableError

GSM8K_REPO = "openai/gsm8k"
GSM8K_CONFIG = "main"
# `main` of openai/gsm8k as pinned by other GSM8K pipelines; not re-checked here (no network).
GSM8K_REVISION = "740312add88f781978c0658806c59bc2815b9866"
FIELDS = ("question", "answer")


def gsm8k_target(answer: str) -> str | None:
    """The final number of a reference solution: after the last '####', commas removed."""
    if "####" not in answer:
        return None
    return answer.rsplit("####", 1)[1].strip().replace(",", "")


def records_to_frame(records, source: str, where: str = "row") -> pd.DataFrame:
    """Build a split from (position, record) pairs; `where` is "line" for jsonl, else "row"."""
    rows = []
    for position, record in records:
        place = f"{source} {where} {position}"
        if not isinstance(record, dict):
            raise InputError(f"{place}: expected an object with {list(FIELDS)}, got {record!r:.80}")
        for field in FIELDS:
            if field not in record:
                raise InputError(f"{place}: missing column {field!r}")
            if not isinstance(record[field], str) or not record[field].strip():
                raise InputError(f"{place}: column {field!r} is empty or not text")
        target = gsm8k_target(record["answer"])
        if target is None:
            raise InputError(f"{place}: answer has no '####' before the final number")
        if to_fraction(target) is None:
            raise InputError(f"{place}: the text after '####' is not a number: {target!r}")
        rows.append({"id": len(rows), "question": record["question"],
                     "answer": record["answer"], "target": target})
    if not rows:
        raise InputError(f"{source}: no rows")
    return check_split(pd.DataFrame(rows), source)


def read_gsm8k_file(path: str | Path) -> pd.DataFrame:
    """One split from a .jsonl (one object per line) or .parquet file."""
    path = Path(path)
    if not path.is_file():
        raise MissingInputError(f"GSM8K file {path} not found")
    if path.suffix == ".jsonl":
        return records_to_frame(_jsonl_records(path), str(path), where="line")
    if path.suffix == ".parquet":
        try:
            df = pd.read_parquet(path)
        except Exception as exc:  # pyarrow raises several types for a file that is not parquet
            raise InputError(f"{path}: not a readable parquet file: {exc}") from None
        missing = [field for field in FIELDS if field not in df.columns]
        if missing:
            raise InputError(f"{path}: missing column(s) {missing}")
        return records_to_frame(enumerate(df.to_dict("records")), str(path))
    raise InputError(f"GSM8K file {path}: expected a .jsonl or .parquet file")


def load_gsm8k_local(train_path: str | Path, test_path: str | Path
                     ) -> tuple[pd.DataFrame, pd.DataFrame]:
    train, test = read_gsm8k_file(train_path), read_gsm8k_file(test_path)
    a, b = Path(train_path), Path(test_path)
    if a.resolve() == b.resolve() or a.read_bytes() == b.read_bytes():
        raise InputError(f"config data.train_path and data.test_path: {train_path} and {test_path} "
                         "are the same file; the test split must be held out")
    return train, test


def load_gsm8k_hub(repo_id: str = GSM8K_REPO, config: str = GSM8K_CONFIG,
                   revision: str = GSM8K_REVISION, cache_dir: str | None = None
                   ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(train, test) from the Hugging Face hub, or its local cache when offline."""
    import datasets

    name = f"{repo_id} ({config}) at revision {revision}"
    try:
        dataset = datasets.load_dataset(repo_id, config, revision=revision, cache_dir=cache_dir)
    except Exception as exc:
        raise SourceUnavailableError(
            f"GSM8K: cannot load {name}: {type(exc).__name__}: {exc}. Without a network, the "
            "data must already be in the Hugging Face cache (HF_HUB_OFFLINE=1, "
            "HF_DATASETS_OFFLINE=1), or use load_gsm8k_local with .jsonl/.parquet files") from exc
    splits = []
    for split in ("train", "test"):
        if split not in dataset:
            raise InputError(f"GSM8K: {name} has no {split!r} split (found {list(dataset)})")
        splits.append(records_to_frame(enumerate(dataset[split]), f"{repo_id}:{split}"))
    return splits[0], splits[1]


def _jsonl_records(path: Path):
    """(line number, object) for each non-blank line; read as bytes and decoded a line at a
    time, so that text that is not UTF-8 is named by its line (a BOM on the first is allowed)."""
    with path.open("rb") as lines:
        for number, raw in enumerate(lines, start=1):
            try:
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(f"{path} line {number}: not UTF-8 text (byte {raw[exc.start]:#04x} "
                                 f"at column {exc.start + 1})") from None
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"{path} line {number}: not valid JSON: {exc}") from None
