"""The run's tables as DataFrames, and a dependency-free Markdown writer for them.

Every builder takes what a stage wrote (dicts and DataFrames, or None for an output that does
not exist yet) and returns a DataFrame whose missing parts read "not run".
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ratchet.rl import MODES as TRAIN_MODES

NOT_RUN = "not run"


def fmt(x) -> str:
    """A cell: 3 significant digits, scientific below 0.01; ints as ints; text as is."""
    if x is None:
        return NOT_RUN
    if isinstance(x, (bool, np.bool_)):
        return str(bool(x))
    if isinstance(x, (int, np.integer)):
        return f"{int(x):,}"
    if isinstance(x, (float, np.floating)):
        x = float(x)
        if math.isnan(x):
            return "-"
        if x == 0:
            return "0"
        if abs(x) < 1e-2 or abs(x) >= 1e6:
            return f"{x:.2e}"
        return f"{x:.4g}"
    return str(x)


def markdown(df: pd.DataFrame) -> str:
    """A GitHub pipe table (no `tabulate` needed)."""
    cols = [str(c).replace("|", "\\|") for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(fmt(v).replace("|", "\\|") for v in row) + " |")
    return "\n".join(lines)


def percent(x) -> str:
    return NOT_RUN if x is None else f"{100 * float(x):.1f}%"


# ---------------------------------------------------------------------------- accuracy
def accuracy_table(evals: dict[str, dict | None], gains: dict[str, dict] | None = None) -> pd.DataFrame:
    """One row per eval (baseline, after_colocated, after_split): greedy accuracy and co;
    `gains` (eval name -> `paired_gain`) adds the gain over the baseline on the same problems."""
    gains = gains or {}
    columns = ("accuracy", "gain (paired)", "n", "format rate", "mean tokens", "tokens/s")
    rows = []
    for name, ev in evals.items():
        if ev is None:
            rows.append({"eval": name, **{c: NOT_RUN for c in columns}})
            continue
        g = gains.get(name)
        rows.append({"eval": name,
                     "accuracy": f"{100 * ev['accuracy']:.2f}% ± {100 * ev.get('accuracy_stderr', 0):.2f}",
                     "gain (paired)": (f"{100 * g['gain']:+.2f} ± {100 * g['gain_stderr']:.2f} points "
                                       f"(+{g['improved']} / -{g['worsened']})") if g and g["gain_n"] > 1 else "",
                     "n": int(ev["n"]), "format rate": ev.get("format_rate"),
                     "mean tokens": ev.get("mean_tokens"), "tokens/s": ev.get("tokens_per_s")})
    return pd.DataFrame(rows)


def paired_gain(before: pd.DataFrame, after: pd.DataFrame) -> dict:
    """Accuracy after minus before on the same problems, with the standard error of the
    mean per-problem difference (paired: the problems' own difficulty cancels)."""
    joined = before[["id", "reward"]].merge(after[["id", "reward"]], on="id", suffixes=("_before", "_after"))
    d = (joined["reward_after"] >= 1).astype(float) - (joined["reward_before"] >= 1).astype(float)
    n = len(d)
    return {"gain": float(d.mean()) if n else None,
            "gain_stderr": float(d.std(ddof=1) / np.sqrt(n)) if n > 1 else None,
            "gain_n": n, "improved": int((d > 0).sum()), "worsened": int((d < 0).sum())}


# ---------------------------------------------------------------------------- training
def _mean(df: pd.DataFrame, col: str):
    if df is None or col not in df:
        return None
    values = pd.to_numeric(df[col], errors="coerce").dropna()
    return float(values.mean()) if len(values) else None


def _max(df: pd.DataFrame, col: str):
    if df is None or col not in df:
        return None
    values = pd.to_numeric(df[col], errors="coerce").dropna()
    return float(values.max()) if len(values) else None


def timing_table(train: dict[str, pd.DataFrame | None]) -> pd.DataFrame:
    """Seconds per training step (mean over steps) and their parts, per mode."""
    columns = {"step s": "time/step_s", "generate s": "time/generate_s", "train s": "time/train_s",
               "sync s": "time/sync_s", "wait s": "time/wait_s"}
    rows = []
    for mode, df in train.items():
        if df is None:
            rows.append({"mode": mode, "steps": NOT_RUN, **{c: NOT_RUN for c in columns}})
            continue
        steps = int(df["train/loss"].notna().sum()) if "train/loss" in df else len(df)
        rows.append({"mode": mode, "steps": steps, **{c: _mean(df, k) for c, k in columns.items()}})
    return pd.DataFrame(rows)


def training_gap_table(train: dict[str, pd.DataFrame | None]) -> pd.DataFrame:
    """The engine-trainer gap over training, per mode: means over steps and the worst step."""
    columns = {"mean |dlogp|": (_mean, "mismatch/logprob_abs_diff_mean"),
               "p99 |dlogp| (mean over steps)": (_mean, "mismatch/logprob_abs_diff_p99"),
               "max |dlogp| (worst step)": (_max, "mismatch/logprob_abs_diff_max"),
               "ratio outside band": (_mean, "mismatch/ratio_outside_share"),
               "KL k3": (_mean, "mismatch/kl_k3"), "reward": (_mean, "train/reward")}
    rows = []
    for mode, df in train.items():
        if df is None:
            rows.append({"mode": mode, **{c: NOT_RUN for c in columns}})
        else:
            rows.append({"mode": mode, **{c: f(df, k) for c, (f, k) in columns.items()}})
    return pd.DataFrame(rows)


def verify_table(verify: dict | None, modes=TRAIN_MODES) -> pd.DataFrame:
    """The rerun check: per mode, whether the first steps replay bit for bit."""
    rows = []
    for mode in modes:
        result = (verify or {}).get(mode)
        if result is None:
            rows.append({"mode": mode, "steps rerun": NOT_RUN, "identical": NOT_RUN,
                         "first divergence": NOT_RUN})
            continue
        first = result.get("first_divergence")
        where = "none" if not first else f"step {first['step']}: {first['quantity']}"
        rows.append({"mode": mode, "steps rerun": result.get("steps_compared"),
                     "identical": "yes" if result.get("identical") else "NO", "first divergence": where})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------- ablations
def decomposition_table(frame: pd.DataFrame | None) -> pd.DataFrame | None:
    if frame is None:
        return None
    out = frame[["updates", "engine_dtype", "source", "abs_diff_mean", "abs_diff_p99",
                 "abs_diff_max", "ratio_outside_share", "num_tokens"]].copy()
    out.columns = ["updates", "dtype", "source", "mean |dlogp|", "p99", "max", "outside band", "tokens"]
    return out


def decomposition_compact(frame: pd.DataFrame | None, metric: str = "abs_diff_max") -> pd.DataFrame | None:
    """updates x (dtype source) of one metric: the figure as a table."""
    if frame is None:
        return None
    wide = frame.pivot_table(index="updates", columns=["engine_dtype", "source"], values=metric,
                             sort=False)
    wide.columns = [f"{d} {s}" for d, s in wide.columns]
    return wide.reset_index()


ENGINE_NAMES = {"vllm": "vLLM", "cuda": "ratchet", "numpy": "ratchet (numpy)"}


def by_engine(frame: pd.DataFrame) -> pd.DataFrame:
    """ablate_decompose_vllm's rows with `engine_dtype` naming the engine too ("vLLM fp16"), so
    the decomposition's tables and figure show one column per engine and dtype."""
    names = frame["backend"].map(ENGINE_NAMES).fillna(frame["backend"])
    return frame.assign(engine_dtype=names + " " + frame["engine_dtype"])


def visibility_table(frame: pd.DataFrame | None, updates=(0, 1, 2, 3, 10, 30)) -> pd.DataFrame | None:
    """One row per selected update: masters moved, engine values changed, off grid, per dtype."""
    if frame is None:
        return None
    keep = frame[frame["update"].isin(updates) | (frame["update"] == frame["update"].max())]
    rows = []
    for update, part in keep.groupby("update", sort=True):
        row = {"update": int(update), "masters moved": float(part["moved_share"].iloc[0])}
        for r in part.itertuples(index=False):
            row[f"{r.dtype} changed"] = r.changed_share
        for r in part.itertuples(index=False):
            row[f"{r.dtype} off grid"] = r.off_grid_share
        rows.append(row)
    return pd.DataFrame(rows)


def fix_table(runs: pd.DataFrame | None) -> pd.DataFrame | None:
    if runs is None:
        return None
    cols = {"run": "run", "weight_dtype": "forward weights", "is_correction": "correction",
            "updates": "updates", "reward_last_fifth": "reward (last 5th)",
            "accuracy": "accuracy", "final_gap_mean": "mean |dlogp| after",
            "final_gap_max": "max |dlogp| after", "final_ratio_outside_share": "outside band after"}
    present = [c for c in cols if c in runs]
    return runs[present].rename(columns=cols)


def fix_gap_by_step(steps: pd.DataFrame | None) -> pd.DataFrame | None:
    """Per run: mean and worst per-step gap during training, and the mean reward."""
    if steps is None:
        return None
    rows = []
    for run, part in steps.groupby("run", sort=False):
        rows.append({"run": run, "steps": len(part),
                     "mean |dlogp| (mean over steps)": _mean(part, "gap_mean"),
                     "max |dlogp| (worst step)": _max(part, "gap_max"),
                     "outside band": _mean(part, "ratio_outside_share"),
                     "reward": _mean(part, "reward")})
    return pd.DataFrame(rows)


def gradient_compact(frame: pd.DataFrame | None, metric: str = "rel_diff") -> pd.DataFrame | None:
    """(dtype, updates) x variant of one metric, the reference left out (cosine 1, rel 0)."""
    if frame is None:
        return None
    part = frame[frame["variant"] != "reference"]
    wide = part.pivot_table(index=["engine_dtype", "updates"], columns="variant", values=metric,
                            sort=False)
    extra = frame.groupby(["engine_dtype", "updates"], sort=False)[["num_tokens", "gap_mean"]].first()
    out = wide.join(extra).reset_index()
    return out.rename(columns={"engine_dtype": "dtype", "num_tokens": "tokens", "gap_mean": "mean |dlogp|"})


def gradient_table(frame: pd.DataFrame | None) -> pd.DataFrame | None:
    if frame is None:
        return None
    out = frame[["engine_dtype", "updates", "variant", "cosine", "rel_diff", "norm", "ratio_max_dev",
                 "weight_mean", "num_tokens", "gap_mean"]].copy()
    out["cosine"] = 1 - out["cosine"]
    out.columns = ["dtype", "updates", "variant", "1 - cosine", "rel diff", "|g|", "max |ratio - 1|",
                   "mean weight", "tokens", "mean |dlogp|"]
    return out
# ---------------------------------------------------------------------------- ablate_learning
def _points(value, stderr) -> str:
    return f"{100 * value:+.2f} ± {100 * stderr:.2f}"


def learning_table(runs: pd.DataFrame | None) -> pd.DataFrame | None:
    """ablate_learning per run: accuracy before and after, the paired gain (points), the gap
    (absent from tables made before it was recorded: NaN)."""
    if runs is None:
        return None
    return pd.DataFrame([{
        "engine": r.dtype, "remedy": r.remedy, "steps": r.steps, "n": r.n,
        "accuracy at step 0": f"{100 * r.baseline_accuracy:.2f}%",
        "accuracy after": f"{100 * r.accuracy:.2f}% ± {100 * r.accuracy_stderr:.2f}",
        "gain (paired, points)": f"{_points(r.gain, r.gain_stderr)} (+{r.improved} / -{r.worsened})",
        "gain established": bool(r.gain_established),
        "reward, first 10th": r.reward_first_tenth, "reward, last 10th": r.reward_last_tenth,
        "mean gap |dlogp| per step": getattr(r, "gap_mean_mean_over_steps", float("nan")),
    } for r in runs.itertuples()])


def learning_diff_table(diffs: pd.DataFrame | None) -> pd.DataFrame | None:
    """ablate_learning's paired differences between remedies after training (points)."""
    if diffs is None:
        return None
    return pd.DataFrame([{
        "engine": d.dtype, "b - a": f"{d.b} - {d.a}", "diff (points)": _points(d.diff, d.stderr),
        "z": d.z, "95% CI (points)": f"[{100 * d.ci_low:+.2f}, {100 * d.ci_high:+.2f}]",
        "problems b better / worse": f"{d.better} / {d.worse}", "p (Holm)": d.p_holm,
        "established": bool(d.established),
    } for d in diffs.itertuples()])
