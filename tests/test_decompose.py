"""The decomposition (and the visibility count) on a tiny model with real GRPO updates: the
right rows, sane orderings, an fp32 engine agreeing with the fp32 trainer, and frames that
are identical when run twice."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from configured import ablate_settings
from tiny_setup import tiny_setup

from ratchet.mismatch.decompose import SOURCES, along_updates
from ratchet.mismatch.fix import fix_runs
from ratchet.rl.runtime import Laps

# the study's lr: a step of 1e-6 is a fraction of the fp16 spacing of most weights (N(0, 0.02))
SETTINGS = dict(updates=(0, 1, 3), num_rollouts=16, max_new_tokens=4, problems_per_step=4,
                group_size=8, lr=1e-6, engine_dtypes=("fp16", "bf16", "fp32"),
                visibility_updates=3, max_steps_per_update=30, seed=0, engine_dtype="fp16",
                micro_batch_size=5)  # the exact source replays in groups of 5, not 16


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A seeded tiny Qwen2 model converted to fp16, and the synthetic task."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small: thread start-up costs more than the maths
    yield tiny_setup(tmp_path_factory.mktemp("tiny"), num_measure=SETTINGS["num_rollouts"])
    torch.set_num_threads(threads)


def decomposition(setup, settings) -> pd.DataFrame:
    return along_updates(setup, settings, visibility_updates=0)[0]


def visibility(setup, settings) -> pd.DataFrame:
    return along_updates(setup, settings, measure_at=())[1]


@pytest.fixture(scope="module")
def frame(tiny) -> pd.DataFrame:
    return decomposition(tiny, ablate_settings(**SETTINGS))


def row(frame, updates, dtype, source):
    r = frame[(frame["updates"] == updates) & (frame["engine_dtype"] == dtype) & (frame["source"] == source)]
    assert len(r) == 1, (updates, dtype, source)
    return r.iloc[0]


def test_every_source_for_every_dtype_and_update_count(frame):
    assert set(frame["updates"]) == {0, 1, 3}
    for (updates, dtype), part in frame.groupby(["updates", "engine_dtype"]):
        assert list(part["source"]) == list(SOURCES), (updates, dtype)
        assert part["num_tokens"].nunique() == 1  # every source on the same tokens
        assert (part["num_tokens"] > 0).all()
    for col in ("abs_diff_mean", "abs_diff_p99", "abs_diff_max", "ratio_outside_share"):
        assert (frame[col] >= 0).all() and np.isfinite(frame[col]).all()
    assert (frame["abs_diff_mean"] <= frame["abs_diff_p99"] + 1e-12).all()
    assert (frame["abs_diff_p99"] <= frame["abs_diff_max"] + 1e-12).all()
    assert (frame.groupby("updates")["steps"].first().diff().dropna() >= 1).all()


def test_fp32_engine_agrees_with_the_fp32_trainer(frame):
    """An fp32 engine on the fp32 masters differs from the fp32 trainer only by float32
    summation order, whatever the updates; trainer-only sources are exactly 0 in fp32."""
    for updates in (0, 1, 3):
        total = row(frame, updates, "fp32", "total")
        assert total["abs_diff_max"] < 2e-5, total
        for source in ("weight_rounding", "arithmetic"):
            assert row(frame, updates, "fp32", source)["abs_diff_max"] == 0.0
    # and far below what a 16-bit engine shows
    fp32, fp16 = (row(frame, 0, d, "total")["abs_diff_mean"] for d in ("fp32", "fp16"))
    assert fp32 * 20 < fp16


def test_the_sources_chain_to_the_total(frame):
    """weight rounding, arithmetic and engine kernels chain from the fp32 trainer to the engine:
    per token they add up to the total, so |total| <= their sum (mean and max alike)."""
    for (updates, dtype), part in frame.groupby(["updates", "engine_dtype"]):
        m = part.set_index("source")
        for col in ("abs_diff_mean", "abs_diff_max"):
            chain = m.loc[["weight_rounding", "arithmetic", "engine_kernels"], col]
            assert m.at["total", col] <= chain.sum() + 1e-9, (updates, dtype, col)
            assert m.at["fixed", col] <= chain.iloc[1:].sum() + 1e-9, (updates, dtype, col)


def test_the_exact_fix_leaves_nothing_on_a_batch_invariant_engine(frame):
    """The engine's teacher forcing (in groups of the trainer's micro-batch, not the rollout's
    batch) gives every sampled token its sampling-time log-probability bit for bit, at every
    update count and dtype, while the rounded-weights fix leaves the engine's arithmetic."""
    for (updates, dtype), part in frame.groupby(["updates", "engine_dtype"]):
        m = part.set_index("source")
        assert m.at["exact", "abs_diff_max"] == 0.0, (updates, dtype)
        if dtype != "fp32":
            assert m.at["fixed", "abs_diff_max"] > 0, (updates, dtype)


def test_orderings(frame):
    # the converted weights are on the fp16 grid: before any update, rounding them changes nothing
    assert row(frame, 0, "fp16", "weight_rounding")["abs_diff_max"] == 0.0
    assert row(frame, 0, "fp16", "fixed")["abs_diff_max"] == row(frame, 0, "fp16", "total")["abs_diff_max"]
    for updates in (1, 3):
        wr = row(frame, updates, "fp16", "weight_rounding")
        assert wr["abs_diff_max"] > 0  # the masters have left the grid
        for dtype in ("fp16", "bf16"):
            total = row(frame, updates, dtype, "total")
            # the total holds the weight rounding (roughly: the activation rounding adds noise)
            rounding = row(frame, updates, dtype, "weight_rounding")
            assert total["abs_diff_mean"] >= 0.5 * rounding["abs_diff_mean"]
            # the fix removes the weight part: it never leaves much more than the total
            assert row(frame, updates, dtype, "fixed")["abs_diff_mean"] <= 1.5 * total["abs_diff_mean"]
    # the masters drift off the fp16 grid while the engine rounds the drift away: the fix,
    # which gives the trainer the engine's weights, cuts the gap
    assert row(frame, 3, "fp16", "fixed")["abs_diff_max"] < row(frame, 3, "fp16", "total")["abs_diff_max"]
    assert row(frame, 3, "fp16", "fixed")["abs_diff_mean"] < row(frame, 3, "fp16", "total")["abs_diff_mean"]
    for updates in (0, 1, 3):  # bf16 keeps 3 fewer mantissa bits than fp16: larger gaps
        for source in ("total", "arithmetic", "engine_kernels"):
            bf16, fp16 = (row(frame, updates, d, source)["abs_diff_mean"] for d in ("bf16", "fp16"))
            assert bf16 > fp16, (updates, source)


def test_decomposition_and_visibility_are_identical_when_rerun(tiny, frame):
    again = decomposition(tiny, ablate_settings(**SETTINGS))
    pd.testing.assert_frame_equal(frame, again, check_exact=True)
    settings = ablate_settings(**SETTINGS)
    first, second = visibility(tiny, settings), visibility(tiny, settings)
    pd.testing.assert_frame_equal(first, second, check_exact=True)


def test_one_run_gives_the_decomposition_and_the_visibility(tiny, frame):
    # the pipeline measures both along one GRPO run: each equals its own run's
    settings = ablate_settings(**SETTINGS)
    both, vis, _ = along_updates(tiny, settings)
    pd.testing.assert_frame_equal(frame, both, check_exact=True)
    pd.testing.assert_frame_equal(visibility(tiny, settings), vis, check_exact=True)


def test_the_hooks_say_each_update_and_each_measurement_as_they_end(tiny):
    """What the stages' time left is made of (MeasuredRunEta): each update as it ends, and the
    measurements after it as they end, before the last of their logs (whose progress line then
    counts them done)."""
    settings = ablate_settings(**{**SETTINGS, "engine_dtypes": ("fp16", "bf16")})
    events = []
    along_updates(tiny, settings, visibility_updates=0, measure_at=(0, 3), gradient_at=(1, 3),
                  log=lambda u, rows: events.append(("sources", u)),
                  log_gradient=lambda dtype, u, rows: events.append((dtype, u)),
                  log_update=lambda u: events.append(("update", u)),
                  log_measured=lambda u: events.append(("measured", u)))
    assert events == [("update", 0), ("measured", 0), ("sources", 0),
                      ("update", 1), ("fp16", 1), ("measured", 1), ("bf16", 1),
                      ("update", 2),
                      ("update", 3), ("sources", 3), ("fp16", 3), ("measured", 3), ("bf16", 3)]


def test_visibility_on_real_updates(tiny):
    vis = visibility(tiny, ablate_settings(**{**SETTINGS, "engine_dtypes": ("fp16", "bf16")}))
    assert list(vis["update"].unique()) == [0, 1, 2, 3]
    start = vis[vis["update"] == 0].set_index("dtype")
    assert start.loc["fp16", "off_grid_share"] == 0.0  # converted to fp16
    assert start.loc["bf16", "off_grid_share"] > 0.5  # most fp16 values are not bf16 values
    later = vis[vis["update"] > 0]
    # an engine value can change only where the master moved
    assert (later["changed_share"] <= later["moved_share"] + 1e-12).all()
    assert (later["moved_share"] > 0.9).all()  # AdamW moves (nearly) every weight
    # AdamW's first step moves every weight by lr (m / sqrt(v) = sign(g)) from the fp16 grid:
    # visible exactly where half the fp16 spacing is below lr, i.e. on the small weights
    spacing = np.concatenate([np.spacing(np.abs(w).astype(np.float16)).astype(np.float64).ravel()
                              for w in tiny.model.weights.values()])
    predicted = float(np.mean(spacing / 2 < 1e-6))
    first = later[(later["update"] == 1) & (later["dtype"] == "fp16")]["changed_share"].iloc[0]
    assert 0.02 < first < 0.5 and first == pytest.approx(predicted, abs=0.005), (first, predicted)


def test_exact_fix_run_trains_like_the_fix_with_no_gap(tiny):
    """The exact run's loss sees the engine's own log-probabilities (gap 0 at every step and
    after training), and its gradient is the fix's (straight through): same rewards and
    updates as the fix run, whose gap is the engine's arithmetic."""
    settings = ablate_settings(**{**SETTINGS, "fix_runs": ("fix", "exact"), "fix_steps": 10})
    laps = Laps()
    steps, runs = fix_runs(tiny, settings, laps=laps)
    # by phase, for the stage's line: each run's steps as rollouts and the rest
    assert set(laps.laps) >= {"trainer and engines", "fix steps: rollouts", "fix steps: trainer",
                              "exact steps: rollouts", "exact steps: trainer", "final gap"}
    by_run = {name: part.reset_index(drop=True) for name, part in steps.groupby("run")}
    trained = by_run["fix"]["num_tokens"] > 0  # a step whose groups all scored the same trains nothing
    assert trained.sum() >= 2
    assert (by_run["exact"]["gap_max"][trained] == 0).all() and (by_run["fix"]["gap_max"][trained] > 0).all()
    for col in ("reward", "updates", "num_tokens", "clip_fraction"):
        assert by_run["exact"][col].fillna(-1).tolist() == by_run["fix"][col].fillna(-1).tolist(), col
    final = runs.set_index("run")
    assert final.loc["exact", "final_gap_max"] == 0.0 < final.loc["fix", "final_gap_max"]
    assert bool(final.loc["exact", "exact_forward"]) and not bool(final.loc["fix", "exact_forward"])


def test_vllm_beside_the_engine_on_the_same_masters_leaves_the_engines_rows_unchanged(tiny, monkeypatch):
    import fake_vllm

    vllm = fake_vllm.install(monkeypatch, vocab=tiny.model.cfg.vocab_size)  # tokens the tiny model has
    settings = ablate_settings(**{**SETTINGS, "updates": (0, 1), "engine_dtypes": ("fp16",)})
    both = along_updates(tiny, settings, visibility_updates=0, backends=("numpy", "vllm"))[0]
    alone = decomposition(tiny, settings)
    assert list(dict.fromkeys(both["backend"])) == ["numpy", "vllm"]
    ours = both[both["backend"] == "numpy"].drop(columns="backend").reset_index(drop=True)
    pd.testing.assert_frame_equal(ours, alone.reset_index(drop=True))  # vLLM beside it changes nothing
    theirs = both[both["backend"] == "vllm"]
    assert list(theirs["source"]) == list(SOURCES) * 2 and (theirs["num_tokens"] > 0).all()
    [llm] = [i for i in fake_vllm.FakeLLM.instances if isinstance(i, vllm.LLM)]
    assert len(llm.model.loaded) == 2  # synced from the masters at each measured update count


def test_the_ablate_decompose_vllm_stage_writes_both_engines_rows_with_vllm_eager(tmp_path, monkeypatch):
    import fake_vllm

    from ratchet.config import validate
    from ratchet.model.io import load_engine_model
    from ratchet.paths import RunPaths
    from ratchet.stages import run_stage

    monkeypatch.setenv("RATCHET_TRACKING", "off")
    cfg = validate({"results_dir": str(tmp_path), "ablate": {"updates": [0, 1], "num_rollouts": 8,
                                                             "engine_dtypes": ["fp16"], "max_new_tokens": 4}})
    for stage in ("download_model", "download_data", "convert_weights", "build_engine"):
        run_stage(stage, cfg)
    paths = RunPaths.from_config(cfg)
    fake_vllm.install(monkeypatch, vocab=load_engine_model(paths.model).cfg.vocab_size)
    fake_vllm.FakeLLM.instances.clear()
    run_stage("ablate_decompose_vllm", cfg)
    frame = pd.read_parquet(paths.decompose_vllm_table)
    assert set(frame["backend"]) == {"numpy", "vllm"} and set(frame["updates"]) == {0, 1}
    assert paths.decompose_vllm_figure.read_bytes().startswith(b"\x89PNG")
    [llm] = fake_vllm.FakeLLM.instances
    assert llm.kwargs["enforce_eager"] is True  # the rule starts vLLM eager


def test_the_runs_arithmetic_moves_only_the_masters_path(tiny, frame):
    """ablate.updates_compute_dtype: the plain run's updates in another arithmetic. Before any
    update every source is the same measurement bit for bit (each side states its own
    arithmetic); after updates the masters differ, and AdamW's first step is still lr times a
    sign, visible on the same weights."""
    settings = ablate_settings(**{**SETTINGS, "updates_compute_dtype": "bf16"})
    other, vis, _ = along_updates(tiny, settings)
    assert settings.grpo("none").compute_dtype == "fp32"  # the measurements' arithmetic is not the run's
    pd.testing.assert_frame_equal(frame[frame["updates"] == 0], other[other["updates"] == 0], check_exact=True)
    later = other["updates"] == 3
    assert not np.array_equal(frame[later]["abs_diff_mean"].to_numpy(), other[later]["abs_diff_mean"].to_numpy())
    plain = visibility(tiny, ablate_settings(**SETTINGS))
    first = lambda v: v[(v["update"] == 1) & (v["dtype"] == "fp16")]["changed_share"].iloc[0]  # noqa: E731
    assert first(vis) == pytest.approx(first(plain), abs=0.002)


def test_a_setup_rounds_its_weights_once_a_dtype_and_its_engines_stay_apart(tiny, monkeypatch):
    """Setup.engine: the converted weights rounded once per dtype (ablate_fix builds two engines a
    run), each engine holding its own copy: a sync into one leaves the next one's answers alone."""
    import dataclasses

    from ratchet.mismatch.compare import sample
    from ratchet.model import dtypes

    setup = dataclasses.replace(tiny, rounded={})
    calls = []
    real = dtypes.round_to
    monkeypatch.setattr(dtypes, "round_to", lambda x, d: calls.append(d) or real(x, d))
    tensors = len(setup.model.weights)
    first = setup.engine("bf16")
    built = len(calls)  # the cache's rounding and the engine's own on loading
    assert set(calls) == {"bf16"} and built >= tensors and set(setup.rounded) == {"bf16"}
    before = sample(first, setup.measure_prompts[:4], 4, seed=3)
    first.update_weights({k: v * 0 for k, v in setup.model.weights.items()})  # a sync of other weights
    start = len(calls)
    second = setup.for_run(ablate_settings(**SETTINGS).grpo("none")).engine("bf16")  # a run's setup
    assert len(calls) - start == built - tensors  # the engine's own alone: the cache served the rest
    start = len(calls)
    setup.engine("fp16")
    assert len(calls) - start == built and set(setup.rounded) == {"bf16", "fp16"}  # its own rounding
    again = sample(second, setup.measure_prompts[:4], 4, seed=3)
    assert [r.output for r in again] == [r.output for r in before]
    assert [r.logprobs for r in again] == [r.logprobs for r in before]
