"""The run's summary.md: every table of the run and its figures, "not run" where an output is
missing (so it renders while training is still going).

    text = build_summary(ReportInputs(run_name="tiny", baseline=..., decompose=frame, ...))
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from ratchet.report import tables as T

SOURCE_MEANING = [
    ("weight_rounding", "trainer on fp32 weights vs the same trainer on weights rounded to the "
                        "engine dtype, both in fp32 maths: the rounding at every weight sync"),
    ("arithmetic", "trainer in fp32 maths vs fp16/bf16 autocast, identical weights (on the engine "
                   "dtype's grid, so autocast's cast of the weights changes nothing)"),
    ("engine_kernels", "the engine vs the closest trainer (engine-dtype weights and autocast)"),
    ("total", "the engine, synced from the fp32 masters, vs the fp32 trainer: what plain RL sees"),
    ("fixed", "the engine vs the trainer on engine-dtype weights in fp32 maths: what rounding "
              "the trainer's weights leaves (the engine's own arithmetic)"),
    ("exact", "the engine vs the trainer whose forward values come from the engine's kernels on "
              "the same rounded weights (teacher forcing, in the trainer's micro-batches): what "
              "the full fix leaves; 0 means bit-identical log-probabilities"),
]


@dataclass
class ReportInputs:
    run_name: str
    engine: str = ""  # e.g. "numpy, fp16"
    baseline: dict | None = None
    after: dict[str, dict | None] = field(default_factory=dict)  # mode -> after-training eval
    gains: dict[str, dict] = field(default_factory=dict)  # mode -> paired gain over the baseline
    train: dict[str, pd.DataFrame | None] = field(default_factory=dict)  # mode -> metrics
    verify: dict | None = None  # the rerun check (verify/repro.json)
    decompose: pd.DataFrame | None = None
    decompose_vllm: pd.DataFrame | None = None  # ablate_decompose_vllm (on demand, not part of `all`)
    visibility: pd.DataFrame | None = None
    fix_steps: pd.DataFrame | None = None
    fix_runs: pd.DataFrame | None = None
    gradient: pd.DataFrame | None = None
    learning_runs: pd.DataFrame | None = None  # ablate_learning (not part of `all`)
    learning_diffs: pd.DataFrame | None = None
    ablate_summary: dict | None = None
    ablate_settings: dict | None = None
    figures: dict[str, str | None] = field(default_factory=dict)  # name -> path from summary.md


def _table(df: pd.DataFrame | None, what: str) -> str:
    return f"_{what}: not run._" if df is None else T.markdown(df)


def _figure(inputs: ReportInputs, name: str, caption: str) -> str:
    path = inputs.figures.get(name)
    return f"![{caption}]({path})" if path else f"_{caption}: not run._"


def _fix_ratios(record: dict | None) -> list[str]:
    """The fix's factor on the max gap at each update count, per engine dtype: the full fix
    (total / exact) and the rounded weights alone (total / fixed)."""
    record = record or {}
    rows = [{"engine": dtype, "fix": name, **{f"{u} updates": r for u, r in ratios.items()}}
            for key, name in (("fix_max_gap_ratio_by_updates", "full (total / exact)"),
                              ("fix_rounding_only_max_gap_ratio_by_updates", "rounded weights (total / fixed)"))
            for dtype, ratios in (record.get(key) or {}).items()]
    if not rows:
        return []
    return ["The fix divides the max gap by (a gap of 0 counts as 2^-20, the float32 spacing of a "
            "log-probability near -8, so the ratio is then a lower bound):", "",
            T.markdown(pd.DataFrame(rows)), ""]


def build_summary(inputs: ReportInputs) -> str:
    out = [f"# ratchet report: `{inputs.run_name}`", ""]
    if inputs.engine:
        out += [f"Engine: {inputs.engine}.", ""]

    # ---------------------------------------------------------------- accuracy
    modes = list(inputs.after) or list(T.TRAIN_MODES)
    evals = {"baseline": inputs.baseline, **{f"after {m}": inputs.after.get(m) for m in modes}}
    gains = {f"after {m}": g for m, g in inputs.gains.items()}
    out += ["## Accuracy (greedy, test split)", "", T.markdown(T.accuracy_table(evals, gains)), ""]
    if gains:
        out += ["Accuracy ± its binomial standard error; the gain is paired over the same "
                "problems (± the standard error of the per-problem difference; problems gained / "
                "lost).", ""]

    # ---------------------------------------------------------------- training
    train = {m: inputs.train.get(m) for m in (list(inputs.train) or list(T.TRAIN_MODES))}
    out += ["## Training: seconds per step", "", T.markdown(T.timing_table(train)), "",
            "## Training: the engine-trainer gap", "",
            "Per step, on that step's rollouts before the update: |difference of log p| between "
            "the engine's sampling-time log-probabilities and the trainer's (as it computes the "
            "loss); `outside band` is the share of tokens whose ratio leaves [1 - eps, 1 + eps].",
            "", T.markdown(T.training_gap_table(train)), "",
            _figure(inputs, "training", "reward and gap per training step"), "",
            "## Reproducibility: training rerun bit for bit", "",
            "The first steps of each mode rerun from scratch and compared with the training run: "
            "rollout tokens, their log-probabilities, the loss and the weights after each step.",
            "", T.markdown(T.verify_table(inputs.verify, list(train))), ""]

    # ---------------------------------------------------------------- decomposition
    s = inputs.ablate_settings or {}
    setting = ""
    if s:
        setting = (f" GRPO with lr {s.get('lr')}, {s.get('problems_per_step')} problems x "
                   f"{s.get('group_size')} answers a step; gaps measured on {s.get('num_rollouts')} "
                   f"fresh rollouts of at most {s.get('max_new_tokens')} tokens; band eps "
                   f"{s.get('eps')}.")
    out += ["## Where the gap comes from", "",
            "Each source switched on alone, on the same sampled tokens (each engine dtype on its "
            "own engine's rollouts)." + setting, ""]
    out += [f"- `{name}`: {meaning}" for name, meaning in SOURCE_MEANING] + [""]
    out += ["The first three chain from the fp32 trainer to the engine: per token, total = weight "
            "rounding + arithmetic + engine kernels (signed), and fixed = arithmetic + engine "
            "kernels.", ""]
    if inputs.decompose is not None:
        out += ["Max |difference of log p|:", "",
                T.markdown(T.decomposition_compact(inputs.decompose, "abs_diff_max")), "",
                "Mean |difference of log p|:", "",
                T.markdown(T.decomposition_compact(inputs.decompose, "abs_diff_mean")), "",
                *_fix_ratios(inputs.ablate_summary),
                "<details><summary>every row (mean, p99, max, share outside the band)</summary>", "",
                T.markdown(T.decomposition_table(inputs.decompose)), "", "</details>", ""]
    else:
        out += ["_decomposition: not run._", ""]
    out += [_figure(inputs, "decompose", "gap by source against updates"), ""]
    if inputs.decompose_vllm is not None:
        out += ["### vLLM beside ratchet's engine", "",
                "The same sources on vLLM and on ratchet's engine, both synced from the same masters "
                "along one GRPO run, each scored on its own fresh rollouts (`ablate_decompose_vllm`; "
                "vLLM's `exact` is its prompt log-probabilities of the tokens it sampled).", "",
                "Mean |difference of log p|:", "",
                T.markdown(T.decomposition_compact(T.by_engine(inputs.decompose_vllm), "abs_diff_mean")), "",
                _figure(inputs, "decompose_vllm", "gap by source on ratchet's engine and on vLLM"), ""]

    # ---------------------------------------------------------------- visibility
    out += ["## Which updates the engine sees", "",
            "`changed`: share of weights whose engine-dtype value the update changed (what a sync "
            "can transmit); `off grid`: share of fp32 masters the dtype cannot hold exactly.", "",
            _table(T.visibility_table(inputs.visibility), "visibility"), "",
            _figure(inputs, "visibility", "visibility of updates"), ""]

    # ---------------------------------------------------------------- the fix
    out += ["## The fix against importance-sampling corrections", "",
            "GRPO runs from the same seeds: `none` (fp32 forward), `fix` (forward on the "
            "engine-rounded weights, fp32 masters), `exact` (the fix, the forward's values "
            "computed by the engine's kernels, its gradient the fix's), `tis` (truncated "
            "importance sampling), `mis` (masked importance sampling). After training: greedy accuracy on the test split and "
            "the gap on fresh rollouts.", "",
            _table(T.fix_table(inputs.fix_runs), "fix runs"), "",
            _table(T.fix_gap_by_step(inputs.fix_steps), "fix runs"), "",
            _figure(inputs, "fix", "the fix against TIS and MIS"), ""]

    # ---------------------------------------------------------------- the gradient
    out += ["## What the gap does to the gradient", "",
            "On one fresh batch of the engine's rollouts after each count of updates (one plain "
            "GRPO run per engine dtype), the policy gradient of each variant against the "
            "on-policy one (fp32 forward, old = the trainer's own log-probabilities): "
            "`engine_old` takes the engine's sampling-time log-probabilities as old, `tis` / `mis` "
            "correct for them, `fix` is the gradient of the forward on the rounded weights, "
            "`exact` the fix with the engine's values, old = the engine's log-probabilities "
            "again. All parameters in float64, before the norm clip; no optimiser step.", ""]
    if inputs.gradient is not None:
        out += ["|g - g_ref| / |g_ref|:", "", T.markdown(T.gradient_compact(inputs.gradient, "rel_diff")), "",
                "<details><summary>every row (1 - cosine, |g|, the ratio the loss sees, the mean "
                "loss weight)</summary>", "", T.markdown(T.gradient_table(inputs.gradient)), "",
                "</details>", ""]
    else:
        out += ["_gradient: not run._", ""]
    out += [_figure(inputs, "gradient", "the gradient's error against updates"), ""]
    # ---------------------------------------------------------------- learning
    if inputs.learning_runs is not None:  # `snakemake ablate_learning`: left out unless run
        out += ["## Learning with each remedy", "",
                "GRPO from the same seeds per engine dtype and remedy; greedy accuracy on the same "
                "test problems at step 0 and after training. The gain and the differences are paired "
                "problem by problem (± the standard error of the per-problem difference). "
                "`established`: not 0 after Holm's correction over the table's rows at 5% (the "
                "interval shown is the uncorrected 95% one). The errors count test problems for the "
                "weights each run reached: with one seed per run, the training's own randomness is "
                "not in them.", "",
                T.markdown(T.learning_table(inputs.learning_runs)), "",
                T.markdown(T.learning_diff_table(inputs.learning_diffs)) if inputs.learning_diffs is not None
                else "_learning differences: not run._", "",
                _figure(inputs, "learning", "reward and accuracy per remedy"), ""]

    # ---------------------------------------------------------------- records
    out += ["## Records", ""]
    if inputs.ablate_summary:
        rec = pd.DataFrame([{"key": k, "value": v} for k, v in inputs.ablate_summary.items()
                            if isinstance(v, (int, float, str))])
        out += [T.markdown(rec), ""]
    else:
        out += ["_ablation records: not run._", ""]
    return "\n".join(out)
