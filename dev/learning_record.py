"""Issue 21's record, results/records/h200-learning.json, from the parts that GPU sessions
bring back one at a time: ablate_learning's comparison (its summary and tables, from
`python -m ratchet ablate_learning`), the gradient-error table (dev/ablate_record.py's
record of the gradient table) and the two grid conditions (dev/grid_conditions.py). A part not
given is listed under `parts_missing`, and a run the profile asks for (`--asked`: its
`ablate.learning` engine dtypes x remedies) that the comparison lacks under
`learning_runs_missing`, so a partial record never reads as the whole.

    python -m dev.learning_record --learning results/local/ablate \
        --gradient results/records/h200-gradient.json --grid grid-conditions.json \
        --commit C --out results/records/h200-learning.json

Runs from several sessions (`--runs`: folders named dtype-remedy, each with the steps.parquet
and answers.parquet of one ablate_learning_run) are compared first, by the same function as
the pipeline's ablate_learning, into `--learning`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from ratchet.atomic import write_json

PARTS = ("learning", "gradient", "grid_conditions")


def asked_runs(config: Path) -> list[str]:
    """The runs ("fp16-none", ...) a profile's `ablate.learning` section asks for."""
    from ratchet import config as config_mod
    from ratchet.mismatch.learning import LearningSettings

    return [f"{j['dtype']}-{j['remedy']}" for j in LearningSettings.from_config(config_mod.load(config)).jobs()]


def learning_part(ablate: Path, asked: list[str] | None = None) -> dict:
    """The comparison's summary, with every run's row and every paired difference, the runs
    it holds beside those `asked`, and the commit it ran at (a `commit` file beside it)."""
    summary = ablate / "learning_summary.json"
    if not summary.is_file():
        raise SystemExit(f"--learning {ablate}: no learning_summary.json (run `python -m ratchet "
                         "ablate_learning` over the runs first)")
    rows = lambda name: pd.read_parquet(ablate / name).to_dict("records")
    runs = rows("learning.parquet")
    part = {"summary": json.loads(summary.read_text()), "runs": runs, "differences": rows("learning_diffs.parquet"),
            "runs_present": [f"{r['dtype']}-{r['remedy']}" for r in runs]}
    if asked is not None:
        part["runs_asked"] = asked
    if (ablate / "commit").is_file():
        part["commit"] = (ablate / "commit").read_text().strip()
    return part


def compare_runs(run_dirs: list[Path], into: Path, asked: Path) -> None:
    """ablate_learning's comparison of the runs in `run_dirs`, written to `into` (the
    files learning_part reads); `asked`'s ablate.learning gives the steps the record states."""
    from ratchet import config as config_mod
    from ratchet.mismatch.learning import LearningSettings
    from ratchet.paths import RunPaths
    from ratchet.stages.learning import write_comparison

    steps, answers = [], []
    for d in run_dirs:
        for name, into_list in (("steps.parquet", steps), ("answers.parquet", answers)):
            if not (d / name).is_file():
                raise SystemExit(f"--runs {d}: no {name} (a folder of one ablate_learning_run)")
            into_list.append(pd.read_parquet(d / name))
    paths = RunPaths(into.parent, into.name)  # write_comparison writes under paths.ablate
    write_comparison(paths, LearningSettings.from_config(config_mod.load(asked)),
                     pd.concat(steps, ignore_index=True), pd.concat(answers, ignore_index=True))
    for f in paths.ablate.iterdir():
        f.replace(into / f.name)
    paths.ablate.rmdir()


def gradient_part(record: Path) -> dict:
    rec = json.loads(record.read_text())
    if "gradient_table" not in rec:
        raise SystemExit(f"--gradient {record}: no gradient_table (a dev.ablate_record record of ablate_decompose)")
    return {"table": rec["gradient_table"], "commit": rec.get("commit"), "command": rec.get("command")}


def build(learning: Path | None, gradient: Path | None, grid: Path | None, asked: list[str] | None = None) -> dict:
    parts = {"learning": learning and learning_part(learning, asked),
             "gradient": gradient and gradient_part(gradient),
             "grid_conditions": grid and json.loads(grid.read_text())}
    out = {**{k: v for k, v in parts.items() if v}, "parts_missing": [k for k in PARTS if not parts[k]]}
    if parts["learning"] and asked is not None:
        out["learning_runs_missing"] = [r for r in asked if r not in parts["learning"]["runs_present"]]
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--learning", type=Path, help="the ablate/ folder holding ablate_learning's outputs")
    ap.add_argument("--runs", type=Path, nargs="+", help="ablate_learning_run folders to compare into --learning")
    ap.add_argument("--gradient", type=Path, help="dev.ablate_record's record of an ablate_decompose run (its gradient table)")
    ap.add_argument("--grid", type=Path, help="dev.grid_conditions' record")
    ap.add_argument("--asked", type=Path, default=Path("config/local.yaml"),
                    help="the profile whose ablate.learning runs the comparison should hold")
    ap.add_argument("--commit", required=True)
    ap.add_argument("--machine", default="NVIDIA H200 (one GPU, lent machine)")
    ap.add_argument("--command", action="append", default=[])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.runs:
        if not args.learning:
            raise SystemExit("--runs needs --learning, the folder to write their comparison into")
        compare_runs(args.runs, args.learning, args.asked)
    record = {"commit": args.commit, "machine": args.machine, "commands": args.command,
              **build(args.learning, args.gradient, args.grid, asked_runs(args.asked) if args.learning else None)}
    write_json(args.out, record)
    missing = record["parts_missing"] + [f"run {r}" for r in record.get("learning_runs_missing", [])]
    print(f"wrote {args.out}; missing: {', '.join(missing) or 'nothing'}")


if __name__ == "__main__":
    main()
