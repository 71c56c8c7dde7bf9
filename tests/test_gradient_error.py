"""The gradient's error on a tiny model with real GRPO updates: the reference against itself,
the engine's log-probabilities bending the gradient, the remedies that give it back (or not),
a trajectory the measurement leaves alone, the three studies of one run apart, the stage's
table, and a bad update count."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from configured import ablate_settings
from tiny_setup import tiny_setup

from ratchet.config import ConfigError, validate
from ratchet.mismatch.ablation import Trajectory
from ratchet.mismatch.decompose import along_updates
from ratchet.mismatch.gradient import (
    GRADIENT_VARIANTS,
    SEED_OFFSET,
    SHARING_SETS,
    batch_gradient,
    batch_rows,
    compare_gradients,
    fresh_groups,
    gradient_passes,
    variant_config,
)
from ratchet.rl.runtime import Laps
from ratchet.rl.sync import sync_weights

SETTINGS = dict(updates=(0, 3), num_rollouts=8, max_new_tokens=4, problems_per_step=4, group_size=8,
                lr=1e-6, engine_dtypes=("fp16", "bf16"), max_steps_per_update=30, seed=0,
                engine_dtype="fp16", micro_batch_size=5)
COLUMNS = {"updates", "steps", "engine_dtype", "variant", "weight_dtype", "old_logprobs", "is_correction",
           "exact_forward", "cosine", "rel_diff", "norm", "ref_norm", "ratio_max_dev", "weight_mean",
           "num_tokens", "gap_mean", "gap_max"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A seeded tiny Qwen2 model converted to fp16, and the synthetic task."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield tiny_setup(tmp_path_factory.mktemp("tiny"))
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def settings():
    return ablate_settings(**SETTINGS)


@pytest.fixture(scope="module")
def frame(tiny, settings):
    """The gradient alone along the run (no decomposition, no visibility)."""
    return along_updates(tiny, settings, visibility_updates=0, measure_at=(),
                         gradient_at=settings.gradient_updates)[2]


def rows(frame, dtype, updates):
    part = frame[(frame["engine_dtype"] == dtype) & (frame["updates"] == updates)]
    return part.set_index("variant")


def batch(tiny, settings, dtype="fp16"):
    """A policy on the converted weights, an engine of `dtype` on them, and one fresh batch."""
    traj = Trajectory(tiny, dataclasses.replace(settings.grpo("none"), engine_dtype=dtype))
    engine = tiny.engine(dtype)
    sync_weights(engine, traj.policy)
    return traj, engine, fresh_groups(engine, tiny.task, traj.cfg, settings.seed + SEED_OFFSET)


def test_every_variant_for_every_dtype_and_update_count(frame, settings):
    assert set(frame.columns) == COLUMNS
    assert settings.gradient_updates == settings.updates == (0, 3)  # null: ablate.updates
    for (dtype, updates), part in frame.groupby(["engine_dtype", "updates"]):
        assert list(part["variant"]) == list(GRADIENT_VARIANTS), (dtype, updates)
        assert part["num_tokens"].nunique() == 1 and (part["num_tokens"] > 0).all()  # one batch
        assert part["ref_norm"].nunique() == 1 and (part["ref_norm"] > 0).all()
    assert set(frame["updates"]) == {0, 3} and set(frame["engine_dtype"]) == {"fp16", "bf16"}
    assert np.isfinite(frame[["cosine", "rel_diff", "norm"]].to_numpy()).all()


def test_the_reference_against_itself(frame, tiny, settings):
    ref = frame[frame["variant"] == "reference"]
    assert (ref["cosine"] == 1.0).all() and (ref["rel_diff"] == 0.0).all()
    assert (ref["ratio_max_dev"] == 0.0).all() and (ref["norm"] == ref["ref_norm"]).all()
    # and computed twice on the same batch: the same bits, the .grad left as found
    traj, _, groups = batch(tiny, settings)
    cfg = variant_config(settings, "reference", "fp16")
    for p in traj.policy.parameters():
        p.grad = torch.full_like(p, 7.0)
    first, _ = batch_gradient(traj.policy, groups, tiny.task, cfg)
    second, _ = batch_gradient(traj.policy, groups, tiny.task, cfg)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    assert compare_gradients(first, second) | {"norm": 0, "ref_norm": 0} == \
        {"cosine": 1.0, "rel_diff": 0.0, "norm": 0, "ref_norm": 0}
    assert all((p.grad == 7.0).all() for p in traj.policy.parameters())


def test_the_engines_logprobs_as_old_bend_the_gradient(frame):
    """A 16-bit engine's log-probs are off the trainer's: taken as old, every token's ratio
    is theirs, off 1 by about the gap, and the gradient moves; more for bf16 than fp16."""
    for (dtype, updates), part in frame.groupby(["engine_dtype", "updates"]):
        m = part.set_index("variant")
        old = m.loc["engine_old"]
        assert old["gap_max"] > 0 and old["rel_diff"] > 0 and old["cosine"] < 1.0, (dtype, updates)
        assert old["ratio_max_dev"] == pytest.approx(math.expm1(old["gap_max"]), rel=0.05)
    for updates in (0, 3):
        assert rows(frame, "bf16", updates).loc["engine_old", "rel_diff"] > \
            rows(frame, "fp16", updates).loc["engine_old", "rel_diff"]


def test_tis_is_the_engine_ratio_and_mis_inside_its_band_is_the_reference(frame):
    """Inside the clip band and under its cap, TIS weighs each token by pi_trainer / pi_engine,
    which is what the ratio over the engine's log-probs does to the gradient; MIS keeps every
    token whose ratio lies in [low, high], so with gaps this small it is the reference."""
    for (dtype, updates), part in frame.groupby(["engine_dtype", "updates"]):
        m = part.set_index("variant")
        assert m.loc["tis", "gap_max"] < math.log(2.0) / 2  # every ratio well inside both bands
        assert m.loc["tis", "rel_diff"] == pytest.approx(m.loc["engine_old", "rel_diff"], rel=1e-3)
        assert m.loc["tis", "weight_mean"] != 1.0 and m.loc["tis", "ratio_max_dev"] == 0.0
        assert m.loc["mis", "rel_diff"] == 0.0 and m.loc["mis", "weight_mean"] == 1.0, (dtype, updates)


def test_the_fix_and_the_exact_fix(frame, tiny, settings):
    """The fix's gradient is the rounded weights' one: the reference's exactly where rounding
    changes nothing (fp16-converted weights before any update), another elsewhere. The exact
    fix takes the engine's log-probs as old, and they are its forward's values bit for bit
    (NumPy engine, batch invariant): ratio 1, and the fix's gradient exactly."""
    assert rows(frame, "fp16", 0).loc["fix", "rel_diff"] == 0.0
    assert rows(frame, "bf16", 0).loc["fix", "rel_diff"] > 0
    assert rows(frame, "fp16", 3).loc["fix", "rel_diff"] > 0  # the masters left the fp16 grid
    exact, fix = frame[frame["variant"] == "exact"], frame[frame["variant"] == "fix"]
    assert (exact["ratio_max_dev"] == 0.0).all()
    for col in ("cosine", "rel_diff", "norm"):
        assert exact[col].tolist() == fix[col].tolist(), col
    traj, engine, groups = batch(tiny, settings, "bf16")
    g_fix, _ = batch_gradient(traj.policy, groups, tiny.task, variant_config(settings, "fix", "bf16"))
    g_exact, exp = batch_gradient(traj.policy, groups, tiny.task, variant_config(settings, "exact", "bf16"),
                                  engine)
    assert torch.equal(exp.exact[exp.mask], exp.engine[exp.mask])
    assert all(torch.equal(a, b) for a, b in zip(g_fix, g_exact))


def loss_backward_gradient(policy, groups, task, cfg, engine=None):
    """(gradient, Experience) of one cfg the plain way, as update.backward_loss takes it: a
    forward of its own a micro-batch and `loss.backward()` into .grad (no sharing, no upstream
    taken apart), the .grad left as found."""
    from ratchet.rl.experience import make_experience
    from ratchet.rl.update import exact_values, scoring_loss, trainer_forwards

    params = list(policy.parameters())
    exp = make_experience(groups, task, cfg, version=0)
    if cfg.exact_forward:
        exp.exact = exact_values(exp, engine, cfg, engine_sampled=False)
    tokens, saved = float(exp.mask.sum()), [p.grad for p in params]
    for p in params:
        p.grad = None
    try:
        for mb, lp, mask, ent in trainer_forwards(policy, exp, list(range(len(exp.responses))), cfg, True):
            scoring_loss(exp, mb, exp.forward_values(lp, mb), mask, ent, tokens, cfg)[0].backward()
        return [p.grad.detach().clone() for p in params], exp
    finally:
        for p, g in zip(params, saved):
            p.grad = g


def bits(t):
    return t.contiguous().view(torch.uint8)


def test_variants_of_one_forward_share_it_and_each_gets_its_own_bits(tiny, settings):
    """variant_gradients runs each micro-batch's forward once for the variants of one forward and
    each backward once for the variants whose loss gradients at its log-probs agree bit for bit:
    every gradient, and every value its Experience holds, is the bits of the variant's own
    forward and `loss.backward()`; the .grad are left as found. In the tiny run MIS keeps every
    token (its gradient is the reference's) and the exact fix's ratio is 1 (the fix's), so of
    the six losses a micro-batch four backwards run."""
    from ratchet.mismatch.gradient import forward_key, variant_gradients

    small = dataclasses.replace(settings, micro_batch_size=3)  # several micro-batches to accumulate
    for dtype, names, backwards in (("bf16", ("reference", "engine_old", "tis", "mis"), 3),
                                    ("bf16", ("fix", "exact"), 1)):
        traj, engine, groups = batch(tiny, small, dtype)
        cfgs = [variant_config(small, v, dtype) for v in names]
        assert len({forward_key(c) for c in cfgs}) == 1
        for p in traj.policy.parameters():
            p.grad = torch.full_like(p, 7.0)
        counts = {}
        shared = variant_gradients(traj.policy, groups, tiny.task, cfgs, engine, counts=counts)
        micro_batches = len(range(0, int(shared[0][1].mask.shape[0]), 3))
        assert micro_batches > 1
        assert counts == {"forwards": micro_batches, "losses": len(names) * micro_batches,
                          "backwards": backwards * micro_batches}
        for (grads, exp), cfg, name in zip(shared, cfgs, names):
            plain, plain_exp = loss_backward_gradient(traj.policy, groups, tiny.task, cfg, engine)
            assert all(torch.equal(bits(a), bits(b)) for a, b in zip(grads, plain)), name
            alone, _ = batch_gradient(traj.policy, groups, tiny.task, cfg, engine)
            assert all(torch.equal(bits(a), bits(b)) for a, b in zip(grads, alone)), name
            for field in ("trainer", "old", "weights", "entropy"):
                assert torch.equal(getattr(exp, field), getattr(plain_exp, field)), (name, field)
        assert all((p.grad == 7.0).all() for p in traj.policy.parameters())
    with pytest.raises(ValueError, match="the cfgs' forwards differ"):
        variant_gradients(traj.policy, groups, tiny.task, [variant_config(small, "reference", "bf16"),
                                                            variant_config(small, "fix", "bf16")], engine)


def test_variants_that_part_after_sharing_backwards_each_get_their_own_bits(tiny, settings):
    """MIS with a band that masks a token of a later answer but none of the first: it shares the
    reference's backwards until that answer's micro-batch, then takes a copy of their .grad and
    goes on alone, and both gradients are still the bits of their own `loss.backward()`."""
    from ratchet.mismatch.gradient import variant_gradients

    one = dataclasses.replace(settings, micro_batch_size=1)  # a micro-batch an answer
    traj, engine, groups = batch(tiny, one, "bf16")
    ref_cfg = variant_config(one, "reference", "bf16")
    _, exp = loss_backward_gradient(traj.policy, groups, tiny.task, ref_cfg)
    dev = ((exp.trainer - exp.engine).abs() * exp.mask).amax(dim=1)  # each answer's widest log-ratio
    later = int(torch.argmax(dev[1:])) + 1
    assert dev[later] > dev[0], "the tiny batch's first answer has the widest gap: pick another seed"
    t = float(dev[0] + dev[later]) / 2  # the first answer inside the band, `later` not
    mis_cfg = dataclasses.replace(variant_config(one, "mis", "bf16"), mis_low=math.exp(-t), mis_high=math.exp(t))
    counts = {}
    shared = variant_gradients(traj.policy, groups, tiny.task, [ref_cfg, mis_cfg], engine, counts=counts)
    n = int(exp.mask.shape[0])
    assert n < counts["backwards"] < 2 * n and counts["losses"] == 2 * n
    for (grads, _), cfg in zip(shared, (ref_cfg, mis_cfg)):
        plain, _ = loss_backward_gradient(traj.policy, groups, tiny.task, cfg)
        assert all(torch.equal(bits(a), bits(b)) for a, b in zip(grads, plain)), cfg.is_correction
    assert not all(torch.equal(a, b) for a, b in zip(shared[0][0], shared[1][0]))


def test_the_measurement_leaves_the_trajectory_alone(tiny, settings):
    """A fresh batch and its gradients between two updates: the run's masters after the next
    update are the bits of a run that never measured."""
    plain = Trajectory(tiny, settings.grpo("none"))
    plain.advance_to(2, settings.max_steps_per_update)
    measured = Trajectory(tiny, settings.grpo("none"))
    measured.advance_to(1, settings.max_steps_per_update)
    engine = tiny.engine("fp16")
    sync_weights(engine, measured.policy)
    groups = fresh_groups(engine, tiny.task, measured.cfg, settings.seed + SEED_OFFSET + 1)
    assert batch_rows(measured.policy, engine, groups, tiny.task, settings)
    measured.advance_to(2, settings.max_steps_per_update)
    assert measured.step == plain.step
    a, b = plain.masters(), measured.masters()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_three_studies_share_one_run_and_leave_each_other_alone(tiny, settings, frame):
    """ablate_decompose measures the sources, the visibility and the gradients along one run:
    each study's rows are the bits it gives alone (the gradient's from the fixture, the other
    two from a run without it)."""
    both = dataclasses.replace(settings, updates=(0, 1), gradient_updates=(0, 3), visibility_updates=2)
    measured = dataclasses.replace(tiny, measure_prompts=tiny.task.prompts[-8:])
    laps = Laps()
    decompose, vis, grad = along_updates(measured, both, gradient_at=both.gradient_updates, laps=laps)
    # where the run's time went, by phase (the stage prints it)
    assert list(laps.laps) == ["trainer and engines", "visibility", "sources", "gradients: rollouts",
                               "gradients: passes", "gradients: exact scoring", "GRPO updates: rollouts",
                               "GRPO updates: trainer"]
    alone_decompose, alone_vis, _ = along_updates(measured, both)
    assert decompose.equals(alone_decompose) and vis.equals(alone_vis)
    assert sorted(set(decompose["updates"])) == [0, 1] and vis["update"].max() == 2
    assert grad.equals(frame)  # the fixture's: the same update counts, alone


def test_a_bad_update_count_is_one_clear_error(settings):
    with pytest.raises(ConfigError, match=r"ablate\.gradient_updates.*-1 is less than the minimum of 0"):
        validate({"ablate": {"gradient_updates": [0, -1]}})
    with pytest.raises(ValueError, match=r"config ablate\.gradient_updates: needs update counts >= 0, got \[-2\]"):
        dataclasses.replace(settings, gradient_updates=(-2,))
    assert ablate_settings(**{**SETTINGS, "gradient_updates": [3, 0, 3]}).gradient_updates == (0, 3)
    with pytest.raises(ValueError, match="gradient variant 'plain' is not one of"):
        variant_config(settings, "plain", "fp16")


@pytest.mark.slow
def test_the_stage_writes_its_table_and_figure_and_the_report_shows_them(tmp_path, monkeypatch):
    import pandas as pd

    from ratchet.paths import RunPaths
    from ratchet.stages import run_stage

    monkeypatch.setenv("RATCHET_TRACKING", "off")
    monkeypatch.delenv("RATCHET_PIPELINE_ID", raising=False)
    overrides = {"results_dir": str(tmp_path / "results"), "model": {"tiny": {"init_std": 0.1}},
                 "ablate": {"updates": [0, 1], "gradient_updates": [0, 2], "max_new_tokens": 2,
                            "num_rollouts": 8, "engine_dtypes": ["fp16"]}}
    cfg = validate(overrides)
    for stage in ("download_model", "download_data", "convert_weights", "build_engine"):
        run_stage(stage, cfg)
    env = {**os.environ, "RATCHET_TRACKING": "off"}
    args = [f"results_dir={tmp_path / 'results'}", "model.tiny.init_std=0.1", "ablate.updates=[0,1]",
            "ablate.gradient_updates=[0,2]", "ablate.max_new_tokens=2", "ablate.num_rollouts=8",
            "ablate.engine_dtypes=[fp16]"]
    for stage in ("ablate_decompose", "ablate_gradient_run", "ablate_gradient"):  # every job of each
        proc = subprocess.run([sys.executable, "-m", "ratchet", stage, *args], capture_output=True, text=True,
                              env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
    paths = RunPaths.from_config(cfg)
    table = pd.read_parquet(paths.gradient_table)
    assert set(table.columns) == COLUMNS and len(table) == 2 * len(GRADIENT_VARIANTS)
    assert table.equals(pd.read_parquet(paths.gradient_part("fp16")))  # one dtype: its part is the table
    assert sorted(set(table["updates"])) == [0, 2] and paths.gradient_figure.stat().st_size > 0
    assert sorted(p.name for p in paths.ablate.iterdir()) == [  # no temporaries
        "decompose.parquet", "decompose.png", "gradient", "gradient.parquet", "gradient.png", "visibility.parquet",
        "visibility.png"]
    run_stage("report", cfg)
    text = paths.report_summary.read_text()
    assert "## What the gap does to the gradient" in text and "(../ablate/gradient.png)" in text
    record = json.loads(paths.ablate_summary.read_text())
    assert record["gradient_updates"] == 2 and record["gradient_dtype"] == "fp16"
    last = table[(table["updates"] == 2)].set_index("variant")
    assert record["gradient_rel_diff_engine_old"] == last.loc["engine_old", "rel_diff"] > 0


def test_the_ablations_token_budget_cuts_their_passes_and_only_reorders_the_sums(tiny, settings, monkeypatch):
    """ablate.micro_batch_tokens (null: train's) reaches every ablation run; a budget of one
    answer's tokens gives one answer a pass, and the gradient is the same sum in another order."""
    from ratchet.rl import update

    assert settings.micro_batch_tokens is None and settings.grpo("fix").micro_batch_tokens is None
    trained = dataclasses.replace(settings, train=dataclasses.replace(settings.train, micro_batch_tokens=4096))
    assert trained.grpo("tis").micro_batch_tokens == 4096  # the trainings' budget by default
    cut = dataclasses.replace(trained, micro_batch_tokens=ablate_settings(micro_batch_tokens=1).micro_batch_tokens)
    assert all(cut.grpo(run).micro_batch_tokens == 1 for run in ("none", "fix", "exact", "tis", "mis"))
    assert variant_config(cut, "engine_old", "bf16").micro_batch_tokens == 1
    passes = []
    real = update.micro_batches
    monkeypatch.setattr(update, "micro_batches", lambda *a, **k: passes.append(real(*a, **k)) or passes[-1])
    traj, _, groups = batch(tiny, settings)
    whole, _ = batch_gradient(traj.policy, groups, tiny.task, variant_config(settings, "reference", "fp16"))
    one_each, _ = batch_gradient(traj.policy, groups, tiny.task, variant_config(cut, "reference", "fp16"))
    assert len(passes) == 2  # one cut a gradient
    assert len(passes[0]) < len(passes[1]) == sum(map(len, passes[0])) and all(len(p) == 1 for p in passes[1])
    assert compare_gradients(one_each, whole)["rel_diff"] < 1e-5


def _compare_gradients_out_of_place(grads, ref):
    """compare_gradients as it was written before its difference went in place (four float64
    temporaries a parameter): the reference its bits are checked against."""
    dot = sq = ref_sq = diff_sq = 0.0
    for g, r in zip(grads, ref):
        g64, r64 = g.detach().double().flatten(), r.detach().double().flatten()
        dot += float(torch.dot(g64, r64))
        sq += float(torch.dot(g64, g64))
        ref_sq += float(torch.dot(r64, r64))
        diff_sq += float(torch.sum((g64 - r64) ** 2))
    return dot, sq, ref_sq, diff_sq


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_compare_gradients_in_place_gives_the_bits_of_the_four_temporaries_and_leaves_its_inputs(dtype):
    gen = torch.Generator().manual_seed(0)
    shapes = [(257, 33), (1000,), (3, 5, 7)]
    grads = [torch.randn(s, generator=gen, dtype=dtype) for s in shapes]
    ref = [g + 1e-3 * torch.randn(g.shape, generator=gen, dtype=dtype) for g in grads]
    ref[0] = ref[0].t().contiguous().t()  # a view across its storage: flatten copies it
    before = [g.clone() for g in grads], [r.clone() for r in ref]
    got = compare_gradients(grads, ref)
    dot, sq, ref_sq, diff_sq = _compare_gradients_out_of_place(grads, ref)
    assert got["rel_diff"] == math.sqrt(diff_sq / ref_sq) and got["norm"] == math.sqrt(sq)
    assert got["ref_norm"] == math.sqrt(ref_sq) and got["cosine"] == max(-1.0, min(1.0, dot / math.sqrt(sq * ref_sq)))
    assert all(torch.equal(a, b) for a, b in zip(grads, before[0]))
    assert all(torch.equal(a, b) for a, b in zip(ref, before[1]))
    same = compare_gradients(grads, grads)  # the reference against itself: one list twice
    assert same["rel_diff"] == 0.0 and all(torch.equal(a, b) for a, b in zip(grads, before[0]))


@pytest.mark.parametrize("at_once", [1, 2])
def test_fewer_gradients_at_once_give_the_same_rows(tiny, settings, frame, at_once):
    """ablate.gradients_at_once splits a forward's sharing sets over passes of their own (a
    forward each, the reference's gradient held throughout): the rows are the bits of all at
    once, a micro-batch's forward runs once a pass, and a set's pair still shares its backward."""
    counts: dict = {}
    split = along_updates(tiny, dataclasses.replace(settings, gradients_at_once=at_once), visibility_updates=0,
                          measure_at=(), gradient_at=settings.gradient_updates, gradient_counts=counts)[2]
    assert split.equals(frame)
    together: dict = {}
    along_updates(tiny, settings, visibility_updates=0, measure_at=(), gradient_at=settings.gradient_updates,
                  gradient_counts=together)
    assert counts["losses"] == together["losses"]  # every variant's loss, a micro-batch at a time
    cfgs = {v: variant_config(settings, v, "fp16") for v in GRADIENT_VARIANTS}
    forwards = len(gradient_passes(cfgs, None))  # the forwards a batch: the masters', the rounded
    assert forwards == 2 and len(gradient_passes(cfgs, 1)) == len(SHARING_SETS)
    micro_batches = together["forwards"] // forwards  # over every batch of the run
    assert counts["forwards"] == micro_batches * len(gradient_passes(cfgs, at_once)) > together["forwards"]
    # in the tiny run only the sets' pairs agree (MIS keeps every token, the exact fix's ratio is
    # 1): a pass holds whole sets, so the split loses none of the sharing
    assert together["backwards"] == counts["backwards"] < counts["losses"]


def test_the_passes_take_whole_sharing_sets_the_reference_first(settings):
    """gradient_passes: per forward (the reference's first) its sharing sets in order, at most
    `at_once` of them a pass. None: a forward's all in one pass (the forwards and backwards of
    before the sets: the sharing classes come first seen, the reference's first)."""
    cfgs = {v: variant_config(settings, v, "bf16") for v in GRADIENT_VARIANTS}
    assert gradient_passes(cfgs, 1) == [["reference", "mis"], ["engine_old"], ["tis"], ["fix", "exact"]]
    assert gradient_passes(cfgs, 2) == [["reference", "mis", "engine_old"], ["tis"], ["fix", "exact"]]
    assert gradient_passes(cfgs, None) == gradient_passes(cfgs, 3) == \
        [["reference", "mis", "engine_old", "tis"], ["fix", "exact"]]
    # whatever the sets' order, the reference's set goes first and the reference first in it
    assert gradient_passes(cfgs, 1, (("engine_old",), ("fix", "exact"), ("mis", "reference"), ("tis",)))[0] == \
        ["reference", "mis"]


@pytest.mark.parametrize("sets, match", [
    ((("reference", "mis"), ("engine_old",), ("tsi",), ("fix", "exact")), "do not hold each of the variants"),
    ((("reference", "mis"), ("engine_old",), ("fix", "exact")), "do not hold each of the variants"),
    ((("reference", "mis"), ("engine_old", "mis"), ("tis",), ("fix", "exact")), "do not hold each of the variants"),
    ((("reference", "mis"), ("engine_old", "fix"), ("tis",), ("exact",)), r"spans 2 forwards"),
])
def test_a_sharing_set_typo_a_missing_variant_or_two_forwards_are_one_clear_error(settings, sets, match):
    cfgs = {v: variant_config(settings, v, "bf16") for v in GRADIENT_VARIANTS}
    with pytest.raises(ValueError, match=match):
        gradient_passes(cfgs, 1, sets)
