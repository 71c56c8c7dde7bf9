"""The run's figures, drawn with matplotlib's Agg backend into PNG files.

Each function takes what a stage wrote and a path; a figure whose data is missing says so
on the canvas instead of failing, so the report renders while training is in progress.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

SOURCE_STYLE = {  # source -> (label, colour, line style)
    "total": ("total: engine vs fp32 trainer", "black", "-"),
    "weight_rounding": ("weight rounding at sync", "tab:red", "-"),
    "arithmetic": ("arithmetic precision (autocast)", "tab:blue", "-"),
    "engine_kernels": ("engine kernels vs closest trainer", "tab:green", "-"),
    "fixed": ("fix, rounded weights only (fp32 maths)", "tab:purple", "--"),
    "exact": ("fix, engine's arithmetic too (0 drawn at 2^-20)", "tab:olive", "--"),
}
RUN_STYLE = {"none": "black", "fix": "tab:purple", "exact": "tab:olive", "tis": "tab:orange", "mis": "tab:cyan"}
ZERO_AT = 2.0 ** -20  # where a gap of exactly 0 is drawn on a log axis (ratchet/stages/ablate.py)
DPI = 110


def _save(fig, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=DPI, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    tmp.replace(path)
    return path


def _steps_axis(ax, label: str = "step") -> None:
    ax.set_xlabel(label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _legend_below(ax, ncol: int = 2) -> None:
    """The legend under its axes, never over the lines."""
    ax.legend(fontsize=8, ncol=ncol, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)


def placeholder(path: Path, text: str) -> Path:
    fig, ax = plt.subplots(figsize=(6, 2))
    ax.axis("off")
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=12)
    return _save(fig, path)


def _positive(values) -> np.ndarray:
    """Log axes cannot show 0: mask it (an exactly-zero source is left out at that point)."""
    v = np.asarray(values, dtype=float)
    return np.where(v > 0, v, np.nan)


def _log_by_updates(ax, updates, title: str, ylabel: str, bottom: bool) -> None:
    """A panel of a figure by update count: log y, symlog x ticked at the counts measured."""
    ax.set_yscale("log")
    ax.set_xscale("symlog", linthresh=1)
    ticks = sorted(updates.unique())
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(t) for t in ticks])
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    if bottom:
        ax.set_xlabel("GRPO updates")


def decomposition_figure(frame: pd.DataFrame, path: Path, sharey: bool = False,
                         labels: dict[str, str] | None = None) -> Path:
    """max and mean |dlogp| (log scale) against updates, one line per source, one column per
    engine dtype (or engine); `sharey`: one scale a row, to compare the columns; `labels`:
    sources' legend labels in place of SOURCE_STYLE's."""
    dtypes = list(dict.fromkeys(frame["engine_dtype"]))
    fig, axes = plt.subplots(2, len(dtypes), figsize=(5.2 * len(dtypes), 7.5), squeeze=False,
                             sharex=True, sharey="row" if sharey else False)
    for col, dtype in enumerate(dtypes):
        part = frame[frame["engine_dtype"] == dtype]
        for row, (metric, title) in enumerate([("abs_diff_max", "max |Δ log p|"),
                                               ("abs_diff_mean", "mean |Δ log p|")]):
            ax = axes[row][col]
            for source, (label, colour, style) in SOURCE_STYLE.items():
                label = (labels or {}).get(source, label)
                s = part[part["source"] == source].sort_values("updates")
                if s.empty:
                    continue
                values = np.maximum(s[metric], ZERO_AT) if source == "exact" else _positive(s[metric])
                ax.plot(s["updates"], values, marker="o", color=colour, ls=style, label=label)
            _log_by_updates(ax, part["updates"], f"{dtype} engine: {title}", f"{title} per token (log)",
                            bottom=row == 1)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=9, bbox_to_anchor=(0.5, -0.04))
    fig.suptitle("Training-inference gap by source, on the engine's own fresh rollouts")
    return _save(fig, path)


def visibility_figure(frame: pd.DataFrame, path: Path) -> Path:
    """Share of engine-dtype values each update changes, and of fp32 masters off the grid."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    colours = {"fp16": "tab:red", "bf16": "tab:blue", "fp32": "gray"}
    moved = frame[frame["update"] > 0].drop_duplicates("update")
    ax1.plot(moved["update"], _positive(moved["moved_share"]), color="black", ls=":",
             label="fp32 masters moved")
    for dtype, part in frame.groupby("dtype", sort=False):
        upd = part[part["update"] > 0]
        ax1.plot(upd["update"], _positive(upd["changed_share"]), marker=".", color=colours.get(dtype),
                 label=f"{dtype} value changed")
        ax2.plot(part["update"], part["off_grid_share"], marker=".", color=colours.get(dtype),
                 label=f"masters off the {dtype} grid")
    ax1.set_yscale("log")
    ax1.set_title("Which updates the engine sees")
    _steps_axis(ax1, "update")
    ax1.set_ylabel("share of weights (log)")
    ax2.set_title("fp32 masters the engine cannot hold")
    _steps_axis(ax2, "updates")
    ax2.set_ylabel("share of masters")
    ax2.set_ylim(-0.02, 1.02)
    for ax in (ax1, ax2):
        ax.grid(True, which="both", alpha=0.3)
        _legend_below(ax)
    return _save(fig, path)


def fix_figure(steps: pd.DataFrame, path: Path) -> Path:
    """Per step: the gap between the engine and the trainer as it computes the loss (log), and
    the reward (running mean over 5 steps), one line per run."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for run, part in steps.groupby("run", sort=False):
        part = part.sort_values("step")
        colour = RUN_STYLE.get(run)
        width = 3.5 if run == "none" else 1.5  # runs that coincide stay visible on top of it
        zero = " (0 at 2^-20)" if run == "exact" else ""
        gap_max = np.maximum(part["gap_max"], ZERO_AT) if run == "exact" else _positive(part["gap_max"])
        ax1.plot(part["step"], gap_max, color=colour, marker=".", lw=width, label=f"{run}: max{zero}")
        ax1.plot(part["step"], _positive(part["gap_mean"]), color=colour, ls=":", marker=".", lw=width,
                 label=f"{run}: mean")
        ax2.plot(part["step"], part["reward"].rolling(5, min_periods=1).mean(), color=colour, lw=width,
                 label=run)
    ax1.set_yscale("log")
    ax1.set_title("|Δ log p|, engine vs trainer as it computes the loss")
    ax1.set_ylabel("|Δ log p| per token (log)")
    ax2.set_title("reward (running mean of 5 steps)")
    ax2.set_ylabel("mean reward")
    for ax, ncol in ((ax1, 3), (ax2, 5)):
        _steps_axis(ax)
        ax.grid(True, which="both", alpha=0.3)
        _legend_below(ax, ncol)
    return _save(fig, path)


GRADIENT_STYLE = {  # variant -> (label, colour, line style, width): exact draws on top of fix
    "engine_old": ("old = engine's log-probs, no correction", "black", "-", 3.0),
    "tis": ("TIS", "tab:orange", "-", 1.5),
    "mis": ("MIS", "tab:cyan", "-", 1.5),
    "fix": ("fix (rounded weights)", "tab:purple", "-", 3.5),
    "exact": ("exact fix, old = engine's log-probs", "tab:olive", "--", 1.5),
}


def gradient_figure(frame: pd.DataFrame, path: Path) -> Path:
    """1 - cosine and the relative norm difference to the on-policy gradient (log scale)
    against updates, one line per variant, one column per engine dtype; a gradient equal to
    the reference's (0, off a log axis) is a hollow triangle on the panel's floor."""
    dtypes = list(dict.fromkeys(frame["engine_dtype"]))
    fig, axes = plt.subplots(2, len(dtypes), figsize=(5.2 * len(dtypes), 7.5), squeeze=False,
                             sharex=True)
    for col, dtype in enumerate(dtypes):
        part = frame[frame["engine_dtype"] == dtype]
        for row, (values, title) in enumerate([(lambda s: 1 - s["cosine"], "1 - cosine"),
                                               (lambda s: s["rel_diff"], "|g - g_ref| / |g_ref|")]):
            ax = axes[row][col]
            for variant, (label, colour, style, width) in GRADIENT_STYLE.items():
                s = part[part["variant"] == variant].sort_values("updates")
                if not s.empty:
                    v = np.asarray(values(s), dtype=float)
                    ax.plot(s["updates"], _positive(v), marker="o", color=colour, ls=style, lw=width,
                            label=label)
                    zero = v <= 0
                    ax.plot(s["updates"][zero], np.full(zero.sum(), 0.03), ls="none", marker="v", ms=9,
                            mfc="none", mec=colour, mew=1.6, clip_on=False, transform=ax.get_xaxis_transform())
            _log_by_updates(ax, part["updates"], f"{dtype} engine: {title}", f"{title} (log)",
                            bottom=row == 1)
    handles, labels = axes[0][0].get_legend_handles_labels()
    handles.append(plt.Line2D([], [], ls="none", marker="v", ms=9, mfc="none", mec="grey", mew=1.6))
    labels.append("on the floor: exactly 0 (the reference's gradient)")
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=9, bbox_to_anchor=(0.5, -0.04))
    fig.subplots_adjust(wspace=0.3)
    fig.suptitle("The policy gradient of one fresh batch against the on-policy one (fp32, old = trainer's)")
    return _save(fig, path)


def training_figure(train: dict[str, pd.DataFrame | None], path: Path) -> Path:
    """Reward and the mean engine-trainer gap per step for each training mode that ran."""
    ran = {mode: df for mode, df in train.items() if df is not None and len(df)}
    if not ran:
        return placeholder(path, "training: not run")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for (mode, df), colour in zip(ran.items(), ("tab:blue", "tab:orange", "tab:green")):
        df = df[df["train/reward"].notna()] if "train/reward" in df else df  # not the eval-only rows
        df = df.sort_values("step")
        if "train/reward" in df:
            ax1.plot(df["step"], df["train/reward"].rolling(5, min_periods=1).mean(), color=colour,
                     label=mode)
        if "mismatch/logprob_abs_diff_mean" in df:
            ax2.plot(df["step"], _positive(df["mismatch/logprob_abs_diff_mean"]), color=colour,
                     label=f"{mode}: mean")
        if "mismatch/logprob_abs_diff_max" in df:
            ax2.plot(df["step"], _positive(df["mismatch/logprob_abs_diff_max"]), color=colour, ls=":",
                     label=f"{mode}: max")
    ax1.set_title("reward (running mean of 5 steps)")
    ax1.set_ylabel("mean reward")
    ax2.set_title("|Δ log p|, engine vs trainer")
    ax2.set_ylabel("|Δ log p| per token (log)")
    ax2.set_yscale("log")
    for ax in (ax1, ax2):
        _steps_axis(ax)
        ax.grid(True, which="both", alpha=0.3)
        _legend_below(ax)
    return _save(fig, path)


def learning_figure(steps: pd.DataFrame, curves: pd.DataFrame, path: Path,
                    diffs: pd.DataFrame | None = None) -> Path:
    """ablate_learning, one column per engine dtype: the reward per step (running mean over a
    tenth of the steps, at least 5) and the greedy accuracy at each eval step with its binomial
    standard error, one line per remedy (slightly offset in x so that the bars stay apart);
    with `diffs` (difference_table), a third row: each pair's paired difference after training
    with its 95% interval, filled where Holm establishes it, hollow where it does not."""
    dtypes = list(dict.fromkeys(curves["dtype"]))
    if not dtypes:
        return placeholder(path, "ablate_learning: no runs")
    rows = 3 if diffs is not None and len(diffs) else 2
    heights = [1, 1, 1.3][:rows]
    fig, axes = plt.subplots(rows, len(dtypes), figsize=(6 * len(dtypes), 3.75 * sum(heights)), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    window = max(5, int(steps["step"].max() + 1) // 10) if len(steps) else 5
    for col, dtype in enumerate(dtypes):
        ax1, ax2 = axes[0, col], axes[1, col]
        remedies = list(dict.fromkeys(curves.loc[curves["dtype"] == dtype, "remedy"]))
        span = max(1.0, float(curves["step"].max()))
        for k, remedy in enumerate(remedies):
            colour = RUN_STYLE.get(remedy)
            width = 3.0 if remedy == "none" else 1.5
            part = steps[(steps["dtype"] == dtype) & (steps["remedy"] == remedy)].sort_values("step")
            ax1.plot(part["step"], part["reward"].rolling(window, min_periods=1).mean(), color=colour,
                     lw=width, label=remedy)
            acc = curves[(curves["dtype"] == dtype) & (curves["remedy"] == remedy)].sort_values("step")
            shift = (k - (len(remedies) - 1) / 2) * 0.006 * span
            ax2.errorbar(acc["step"] + shift, acc["accuracy"], yerr=acc["accuracy_stderr"], color=colour,
                         marker="o", ms=4, capsize=3, lw=width, label=remedy)
        ax1.set_title(f"{dtype}: reward (running mean of {window} steps)")
        ax1.set_ylabel("mean reward")
        n = int(curves.loc[curves["dtype"] == dtype, "n"].max())
        ax2.set_title(f"{dtype}: greedy accuracy, {n} test problems (± 1 s.e.)")
        ax2.set_ylabel("accuracy")
        for ax in (ax1, ax2):
            _steps_axis(ax)
            ax.grid(True, alpha=0.3)
            _legend_below(ax, 5)
        if rows == 3:
            _difference_panel(axes[2, col], diffs[diffs["dtype"] == dtype], dtype)
    fig.subplots_adjust(hspace=0.45)
    return _save(fig, path)


def _difference_panel(ax, diffs: pd.DataFrame, dtype: str) -> None:
    """One dtype's paired differences b - a after training, in points, with 95% intervals."""
    if not len(diffs):
        ax.set_axis_off()
        return
    y = np.arange(len(diffs))[::-1]
    for yi, d in zip(y, diffs.itertuples()):
        colour = RUN_STYLE.get(d.b)
        ax.errorbar(100 * d.diff, yi, xerr=[[100 * (d.diff - d.ci_low)], [100 * (d.ci_high - d.diff)]],
                    fmt="o", color=colour, mfc=colour if d.established else "white", ms=6, capsize=3)
    ax.axvline(0, color="black", lw=1)
    ax.set_yticks(y, [f"{d.b} - {d.a}" for d in diffs.itertuples()])
    ax.set_xlabel("accuracy difference after training (points, 95% interval)")
    ax.set_title(f"{dtype}: paired differences (filled: established after Holm)")
    ax.grid(True, axis="x", alpha=0.3)
