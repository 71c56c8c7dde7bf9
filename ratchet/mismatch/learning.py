"""ablate_learning: does a remedy for the mismatch change what GRPO learns? One run per
(engine dtype, remedy) from the same seeds, scored by greedy accuracy on the same test problems
before, during and after training, so that every comparison is paired problem by problem.

    learning = LearningSettings.from_config(cfg)
    steps, answers = learning_run(setup, settings, learning, "bf16", "tis")
    runs, diffs = summarize({(d, r): (steps, answers) for ...})
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ratchet.config import ConfigError
from ratchet.mismatch.ablation import (
    ENGINE_DTYPES,
    FIX_RUNS,
    AblateSettings,
    Setup,
    Trajectory,
    greedy_eval,
)
from ratchet.mismatch.fix import SYNC_COLUMNS, short_gap
from ratchet.mismatch.paired import holm, paired_difference

@dataclass(frozen=True)
class LearningSettings:
    """The `ablate.learning:` section; eval_problems None = every test problem."""
    steps: int
    eval_every: int
    engine_dtypes: tuple[str, ...]
    runs: tuple[str, ...]
    eval_problems: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "engine_dtypes", tuple(self.engine_dtypes))
        object.__setattr__(self, "runs", tuple(self.runs))
        key = "config ablate.learning"
        if not isinstance(self.steps, int) or self.steps < 1:
            raise ConfigError(f"{key}.steps: {self.steps!r}; needs an integer >= 1")
        if not isinstance(self.eval_every, int) or self.eval_every < 1:
            raise ConfigError(f"{key}.eval_every: {self.eval_every!r}; needs an integer >= 1")
        if self.eval_problems is not None and (not isinstance(self.eval_problems, int) or self.eval_problems < 1):
            raise ConfigError(f"{key}.eval_problems: {self.eval_problems!r}; needs an integer >= 1 or null")
        for name, values, known in (("runs", self.runs, tuple(FIX_RUNS)),
                                    ("engine_dtypes", self.engine_dtypes, ENGINE_DTYPES)):
            unknown = [v for v in values if v not in known]
            if unknown or not values or len(set(values)) < len(values):
                raise ConfigError(f"{key}.{name}: {list(values)}; needs distinct entries of {known}")

    @classmethod
    def from_config(cls, cfg: dict) -> "LearningSettings":
        return cls(**cfg["ablate"]["learning"])

    def eval_steps(self) -> list[int]:
        """Step 0 (the baseline), every eval_every steps, and the last."""
        return sorted({0, self.steps, *range(self.eval_every, self.steps, self.eval_every)})

    def jobs(self) -> list[dict[str, str]]:
        return [{"dtype": d, "remedy": r} for d in self.engine_dtypes for r in self.runs]


def check_job(learning: LearningSettings, dtype: str, remedy: str) -> None:
    if {"dtype": dtype, "remedy": remedy} not in learning.jobs():
        raise ValueError(f"ablate_learning: run {dtype}-{remedy} is not one the config asks for "
                         f"(ablate.learning.engine_dtypes {list(learning.engine_dtypes)}, "
                         f"runs {list(learning.runs)})")


# ---------------------------------------------------------------------------- one run
def learning_run(setup: Setup, settings: AblateSettings, learning: LearningSettings, dtype: str,
                 remedy: str, log=None, log_eval=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """GRPO with `remedy` (a key of FIX_RUNS) on an engine of `dtype`, `learning.steps` steps:
    (steps, answers). Per step the reward, the loss's gap and the sync telemetry (fix.py's
    columns); per eval step (before training, every eval_every steps, after the last) each
    test problem's greedy correctness. `log(step, row)` after each step, `log_eval(step,
    accuracy)` after each eval."""
    check_job(learning, dtype, remedy)
    if setup.eval_problems is None or not len(setup.eval_problems):
        raise ValueError("ablate_learning: the setup has no eval problems")
    cfg = dataclasses.replace(settings.grpo(remedy, learning.steps), engine_dtype=dtype)
    setup = setup.for_run(cfg)
    traj = Trajectory(setup, cfg)
    eval_engine = setup.eval_engine(dtype, traj.policy)
    due = set(learning.eval_steps())
    step_rows, answer_parts = [], []

    def score(step: int) -> None:  # the masters after `step` steps
        ev, answers = greedy_eval(setup, traj, eval_engine)
        answer_parts.append(pd.DataFrame({"step": step, "id": answers["id"].to_numpy(),
                                          "correct": (answers["reward"] >= 1).to_numpy(),
                                          "num_tokens": answers["num_tokens"].to_numpy()}))
        if log_eval is not None:
            log_eval(step, ev["accuracy"])

    score(0)
    for step in range(learning.steps):
        m = traj.train_step()
        row = {"step": step, "updates": traj.updates, "reward": m["train/reward"],
               "num_tokens": m["train/num_tokens"], "is_weight_mean": m["train/is_weight_mean"],
               "is_masked_share": m["train/is_masked_share"], "clip_fraction": m["train/clip_fraction"],
               **short_gap(m), **{k.split("/")[1]: m[k] for k in SYNC_COLUMNS}}
        step_rows.append(row)
        if log is not None:
            log(step, row)
        if step + 1 in due:
            score(step + 1)
    meta = {"dtype": dtype, "remedy": remedy}
    steps = pd.DataFrame(step_rows).assign(**meta)
    answers = pd.concat(answer_parts, ignore_index=True).assign(**meta)
    return steps, answers


# ---------------------------------------------------------------------------- the aggregate
def _final(answers: pd.DataFrame, step: int) -> pd.Series:
    """Per-problem correctness at `step`, indexed by problem id."""
    part = answers[answers["step"] == step]
    return part.set_index("id")["correct"].astype(float).sort_index()


def accuracy_curve(answers: pd.DataFrame) -> pd.DataFrame:
    """Accuracy at each eval step with its binomial standard error, per (dtype, remedy)."""
    g = answers.groupby(["dtype", "remedy", "step"], sort=False)["correct"]
    out = g.agg(accuracy="mean", n="size").reset_index()
    out["accuracy_stderr"] = np.sqrt(out["accuracy"] * (1 - out["accuracy"]) / out["n"])
    return out


def run_table(steps: pd.DataFrame, answers: pd.DataFrame, alpha: float = 0.05) -> pd.DataFrame:
    """One row per run: accuracy before training (step 0) and after, the paired gain, the
    reward over the first and last tenth of the steps, the per-step mean gap (|dlogp|) and
    visible share averaged over the steps. `gain_established`: the gain's test
    rejected after Holm's correction over the runs (ratchet/mismatch/paired.py)."""
    rows = []
    for (dtype, remedy), part in answers.groupby(["dtype", "remedy"], sort=False):
        last = int(part["step"].max())
        before, after = _final(part, 0), _final(part, last)
        g = paired_difference(before.to_numpy(), after.reindex(before.index).to_numpy())
        n = len(after)
        acc = float(after.mean())
        own = steps[(steps["dtype"] == dtype) & (steps["remedy"] == remedy)].sort_values("step")
        rewards = own["reward"]
        tenth = max(1, len(rewards) // 10)
        means = {f"{c}_mean_over_steps": float(own[c].mean()) if c in own else np.nan
                 for c in ("gap_mean", "visible_share")}
        rows.append({"dtype": dtype, "remedy": remedy, "steps": last, "n": n,
                     "baseline_accuracy": float(before.mean()), "accuracy": acc,
                     "accuracy_stderr": float(np.sqrt(acc * (1 - acc) / n)) if n else np.nan,
                     "gain": g["diff"], "gain_stderr": g["stderr"], "gain_p": g["p"],
                     "improved": g["better"], "worsened": g["worse"],
                     "reward_first_tenth": float(rewards.head(tenth).mean()),
                     "reward_last_tenth": float(rewards.tail(tenth).mean()), **means})
    table = pd.DataFrame(rows)
    if len(table):
        table["gain_p_holm"], table["gain_established"] = holm(table["gain_p"], alpha)
    return table


def difference_table(answers: pd.DataFrame, alpha: float = 0.05) -> pd.DataFrame:
    """Every pair of remedies within each engine dtype, after training, on the same problems:
    b - a with its paired standard error, z, the 95% interval and the p-value. `established`:
    the difference is not 0 after Holm's correction over all rows of the table (at `alpha`,
    i.e. the interval at Holm's step-down level for that comparison excludes 0; the 95% interval
    shown is the uncorrected one, so it can exclude 0 for a difference that is not established)."""
    rows = []
    for dtype, part in answers.groupby("dtype", sort=False):
        finals = {r: _final(p, int(p["step"].max())) for r, p in part.groupby("remedy", sort=False)}
        for a, b in itertools.combinations(finals, 2):
            common = finals[a].index.intersection(finals[b].index)
            d = paired_difference(finals[a].loc[common].to_numpy(), finals[b].loc[common].to_numpy())
            rows.append({"dtype": dtype, "a": a, "b": b, **d})
    table = pd.DataFrame(rows, columns=["dtype", "a", "b", "diff", "stderr", "n", "z", "ci_low",
                                        "ci_high", "p", "better", "worse"])
    table["p_holm"], table["established"] = holm(table["p"], alpha) if len(table) else ([], [])
    return table


def pooled_difference_table(answers: pd.DataFrame) -> pd.DataFrame:
    """Every pair of remedies run with every engine dtype, pooled over the dtypes: per problem,
    b - a after training averaged over the dtypes, with its paired standard error. Exploratory:
    the dtypes' runs are separate trainings, so pooling doubles the evidence for an effect the
    remedies share, but these rows are outside the Holm family of difference_table (a pattern
    read off it is a hypothesis for runs from fresh seeds, not a finding)."""
    dtypes = list(answers["dtype"].unique())
    finals = {(d, r): _final(p, int(p["step"].max())) for (d, r), p in answers.groupby(["dtype", "remedy"], sort=False)}
    everywhere = [r for r in answers["remedy"].unique() if all((d, r) in finals for d in dtypes)]
    rows = []
    if len(dtypes) > 1:
        for a, b in itertools.combinations(everywhere, 2):
            common = sorted(set.intersection(*(set(finals[(d, r)].index) for d in dtypes for r in (a, b))))
            pooled = [np.mean([finals[(d, r)].loc[common].to_numpy() for d in dtypes], axis=0) for r in (a, b)]
            rows.append({"dtypes": "+".join(dtypes), "a": a, "b": b, **paired_difference(*pooled)})
    return pd.DataFrame(rows, columns=["dtypes", "a", "b", "diff", "stderr", "n", "z", "ci_low", "ci_high", "p",
                                       "better", "worse"])


def record(runs: pd.DataFrame, diffs: pd.DataFrame, learning: LearningSettings,
           pooled: pd.DataFrame | None = None) -> dict:
    """The headline numbers: each run's final accuracy and gain, and which differences are
    established and which are not."""
    out: dict = {"learning_steps": learning.steps, "learning_eval_n": int(runs["n"].max()) if len(runs) else 0}
    for r in runs.itertuples():
        out[f"learning_accuracy_{r.dtype}_{r.remedy}"] = r.accuracy
        out[f"learning_gain_{r.dtype}_{r.remedy}"] = r.gain
        out[f"learning_gain_stderr_{r.dtype}_{r.remedy}"] = r.gain_stderr
    out["learning_established"] = [_difference_text(d.dtype, d) for d in diffs.itertuples() if d.established]
    out["learning_not_established"] = [_difference_text(d.dtype, d) for d in diffs.itertuples() if not d.established]
    if pooled is not None and len(pooled):
        out["learning_pooled_over_dtypes_exploratory"] = [
            f"{_difference_text(d.dtypes, d)} (p {d.p:.3g}, uncorrected)" for d in pooled.itertuples()]
    return out


def _difference_text(label: str, d) -> str:
    """One row of a difference table as the summary lists it: "fp16: fix - none = +2.35 ± 1.28 pts"."""
    return f"{label}: {d.b} - {d.a} = {100 * d.diff:+.2f} ± {100 * d.stderr:.2f} pts"
