"""sha256 of what a refactor must not change, for a results/tiny tree: `python -m dev.tiny_hashes results/tiny`
(the ablation tables, verify, the trained models' manifests and traces, metrics without timings, eval answers)."""
import hashlib, json, sys
from pathlib import Path
import pandas as pd
run = Path(sys.argv[1])
out = {}
for rel in ["ablate/decompose.parquet", "ablate/visibility.parquet", "ablate/fix.parquet",
            "ablate/fix_steps.parquet", "ablate/summary.json", "verify/repro.json",
            "train/colocated/model/manifest.json", "train/split/model/manifest.json",
            "train/colocated/trace.parquet", "train/split/trace.parquet", "model/manifest.json"]:
    p = run / rel
    out[rel] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "MISSING"
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
