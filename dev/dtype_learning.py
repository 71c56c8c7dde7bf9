"""Does the trainer's arithmetic change learning? (issue 18, goal 1.) One split training per
`train.compute_dtype` from the same seed, each scored greedily on the same test problems
after training; this gathers them: each run's final accuracy with its binomial standard
error, its paired difference from the fp32 run on the same problems (with its standard
error), the reward curve's first and last tenth, the step medians and the engine-trainer gap.
A difference is "established" only after Holm's correction over the compute dtypes compared
(two comparisons for three dtypes), as the learning ablation treats its remedies.

    python -m dev.dtype_learning --run fp32=DIR --run bf16=DIR --run fp16=DIR --out record.json

Any other knob of one split training compares the same way, against the run `--reference`
names (e.g. `train.split.extra_groups`: `--reference extra4 --run extra4=DIR --run extra8=DIR`).

Each DIR holds what dev/gpu/dtype-learning.sh copied from one run: metrics.parquet and
after_split.json / after_split_answers.parquet."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from ratchet.mismatch.paired import holm, paired_difference

REFERENCE = "fp32"


def one_run(folder: Path) -> tuple[dict, pd.DataFrame]:
    metrics = pd.read_parquet(folder / "metrics.parquet")
    summary = json.loads((folder / "after_split.json").read_text())
    answers = pd.read_parquet(folder / "after_split_answers.parquet")
    # the training's own rows: the last row holds only the final eval (no reward, no timings)
    trained = metrics.dropna(subset=["train/reward"])
    steps = trained[trained["step"] >= 2] if len(trained) > 2 else trained  # the first two warm up
    tenth = max(1, len(trained) // 10)
    row = {"steps": len(trained), "accuracy": summary["accuracy"], "accuracy_stderr": summary["accuracy_stderr"],
           "n": summary["n"], "reward_first_tenth": float(trained["train/reward"].head(tenth).mean()),
           "reward_last_tenth": float(trained["train/reward"].tail(tenth).mean())}
    for key in ("time/step_s", "time/train_s", "time/generate_s", "mismatch/logprob_abs_diff_mean",
                "mismatch/logprob_abs_diff_max"):
        if key in steps and steps[key].notna().any():
            row[f"median {key}"] = float(np.nanmedian(steps[key]))
    return row, answers


def gather(runs: dict[str, Path], reference: str = REFERENCE) -> dict:
    """The record: per run its row, and against the `reference` run its paired difference."""
    if reference not in runs:
        raise SystemExit(f"--run {reference}=DIR is the reference the others are compared with")
    rows, answers = {}, {}
    for name, folder in runs.items():
        rows[name], answers[name] = one_run(Path(folder))
    ref = answers[reference].sort_values("id")
    for name, frame in answers.items():
        frame = frame.sort_values("id")
        if list(frame["id"]) != list(ref["id"]):
            raise SystemExit(f"{name}: scored on other problems than the {reference} run")
        if name != reference:
            rows[name][f"paired_diff_vs_{reference}"] = paired_difference(ref["reward"].to_numpy(),
                                                                          frame["reward"].to_numpy())
    others = [name for name in rows if name != reference]
    p_holm, established = holm([rows[name][f"paired_diff_vs_{reference}"]["p"] for name in others])
    for name, p, e in zip(others, p_holm, established):
        rows[name][f"paired_diff_vs_{reference}"].update(p_holm=float(p), established=bool(e))
    return {"reference": reference, "runs": rows,
            "within_noise": {name: not bool(e) for name, e in zip(others, established)}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", action="append", required=True, metavar="NAME=DIR")
    ap.add_argument("--reference", default=REFERENCE, help="the run the others are compared with")
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit")
    ap.add_argument("--command")
    args = ap.parse_args()
    runs = dict(item.split("=", 1) for item in args.run)
    record = {"commit": args.commit, "command": args.command, **gather({k: Path(v) for k, v in runs.items()}, args.reference)}
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
