"""An ablation run's outputs gathered into a record: the headline figures the summary stage
computes (ratchet.stages.ablate.records) from whichever tables the run wrote (decompose,
visibility, fix, gradient), the gradient table by engine dtype, update count and remedy, and
where the figures came from (commit, machine, command). Used by the GPU scripts' `collect`.

    python -m dev.ablate_record --ablate results/local/ablate --config config/local.yaml \
        --commit C --machine "NVIDIA H200" --command "snakemake ablate_decompose ..." --out rec.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from ratchet import config
from ratchet.atomic import write_json
from ratchet.mismatch.ablation import AblateSettings
from ratchet.stages.ablate import records

GRADIENT_COLUMNS = ["engine_dtype", "updates", "variant", "cosine", "rel_diff", "gap_mean", "gap_max",
                    "num_tokens"]


def gradient_table(gradient: pd.DataFrame) -> dict:
    """{dtype: {updates: {variant: {1 - cos, rel_diff}}}} with each batch's gap and size."""
    out: dict = {}
    for (dtype, updates), part in gradient.groupby(["engine_dtype", "updates"], sort=False):
        first = part.iloc[0]
        out.setdefault(str(dtype), {})[str(int(updates))] = {
            "gap_mean": float(first["gap_mean"]), "gap_max": float(first["gap_max"]),
            "num_tokens": int(first["num_tokens"]),
            **{str(r["variant"]): {"one_minus_cosine": 1.0 - float(r["cosine"]), "rel_diff": float(r["rel_diff"])}
               for _, r in part.iterrows() if r["variant"] != "reference"}}
    return out


def ablate_record(ablate: Path, cfg: dict) -> dict:
    read = lambda name: pd.read_parquet(ablate / name) if (ablate / name).is_file() else None
    gradient = read("gradient.parquet")
    rec = records(AblateSettings.from_config(cfg), read("decompose.parquet"), read("visibility.parquet"),
                  read("fix.parquet"), gradient)
    if gradient is not None:
        rec["gradient_table"] = gradient_table(gradient)
    rec["tables"] = sorted(p.name for p in ablate.glob("*.parquet"))
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ablate", required=True, help="the run's ablate/ folder")
    ap.add_argument("--config", default="config/local.yaml")
    ap.add_argument("--commit", required=True)
    ap.add_argument("--machine", required=True)
    ap.add_argument("--command", required=True)
    ap.add_argument("--note")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    cfg = config.load(Path(args.config), [])
    rec = {"command": args.command, "commit": args.commit, "device": args.machine,
           **({"note": args.note} if args.note else {}), **ablate_record(Path(args.ablate), cfg)}
    write_json(Path(args.out), rec)
    print({k: v for k, v in rec.items() if not isinstance(v, (dict, list))})


if __name__ == "__main__":
    main()
