"""sha256 of what a refactor must not change, for a results/tiny tree: `python -m dev.tiny_hashes results/tiny`
(the ablation tables, verify, the trained models' manifests and traces, metrics without timings, eval answers).

`--bytes` hashes parquet files as written, as the records before the forty-fifth session did: those bytes
name the pyarrow that wrote them (its version is in the footer), so a newer pyarrow changes them with every
value equal. By default a parquet file is hashed by its content, its schema without metadata and its rows."""
import hashlib, json, sys
from pathlib import Path
import pandas as pd
import pyarrow.parquet as pq


def parquet_content(path: Path) -> bytes:
    """The table's schema (no metadata: pandas' and the writer's) and its rows as CSV (floats written
    to round-trip), independent of the pyarrow that wrote the file."""
    table = pq.read_table(path)
    return (str(table.schema.remove_metadata()) + "\n").encode() + table.to_pandas().to_csv().encode()


def main(argv: list[str]) -> None:
    as_bytes = "--bytes" in argv
    run = Path(next(a for a in argv if not a.startswith("--")))
    out = {}
    for rel in ["ablate/decompose.parquet", "ablate/visibility.parquet", "ablate/fix.parquet",
                "ablate/fix_steps.parquet", "ablate/summary.json", "verify/repro.json",
                "train/colocated/model/manifest.json", "train/split/model/manifest.json",
                "train/colocated/trace.parquet", "train/split/trace.parquet", "model/manifest.json"]:
        p = run / rel
        data = (parquet_content(p) if p.suffix == ".parquet" and not as_bytes else p.read_bytes()) if p.is_file() else None
        out[rel] = hashlib.sha256(data).hexdigest() if data is not None else "MISSING"
    for mode in ("colocated", "split"):
        s = json.loads((run / f"train/{mode}/summary.json").read_text())
        out[f"train/{mode} weights_sha256"] = s["weights_sha256"]
        m = pd.read_parquet(run / f"train/{mode}/metrics.parquet")
        cols = sorted(c for c in m.columns if not c.startswith("time/"))
        out[f"train/{mode}/metrics (no time/ columns)"] = hashlib.sha256(m[cols].to_csv().encode()).hexdigest()
    for name in ("baseline", "after_colocated", "after_split"):
        e = json.loads((run / f"eval/{name}.json").read_text())
        out[f"eval/{name} accuracy"] = e["accuracy"]
        a = pd.read_parquet(run / f"eval/{name}_answers.parquet")
        out[f"eval/{name}_answers"] = hashlib.sha256(a.to_csv().encode()).hexdigest()
    json.dump(out, sys.stdout, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
