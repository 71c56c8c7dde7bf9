"""Per-sync telemetry: the share of weights a sync changes in the engine, the masters off the
engine dtype's grid, and the parity of the engine's buffers with the masters rounded, whose
checksum agrees between NumPy and torch and catches a stale sync."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from test_grpo import cfg, short_job  # noqa: F401 (the module fixture: a prepared tiny run)

from ratchet.model.checksum import block_checksum
from ratchet.rl.telemetry import torch_checksum
from ratchet.model.dtypes import round_to
from ratchet.trainer.precision import torch_dtype


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_the_numpy_engines_checksums_are_torchs_of_the_rounded_masters(dtype):
    from random_model import random_weights
    from test_engine import tiny_config

    from ratchet.engine.numpy.backend import NumpyBackend
    from ratchet.model.layout import expected_shapes

    model_cfg = tiny_config()
    masters = random_weights(model_cfg, seed=3)  # fp32, off every 16-bit grid
    backend = NumpyBackend(model_cfg, dtype, 4, 32)
    backend.load_weights({k: round_to(v, dtype) for k, v in masters.items()})
    held = backend.weight_checksums()
    assert set(held) == set(expected_shapes(model_cfg))
    for name, w in masters.items():
        assert held[name] == torch_checksum(torch.from_numpy(w).to(torch_dtype(dtype))), name


def test_the_checksum_sees_where_a_word_changed_not_only_the_sum():
    words = np.arange(-500, 200_000, dtype=np.int64).astype(np.int16)
    base = block_checksum(words, np)
    swapped = words.copy()
    swapped[[10, 70_000]] = swapped[[70_000, 10]]  # the same multiset of words
    assert block_checksum(swapped, np) != base
    moved = words.copy()
    moved[5] += 1
    moved[5 + (1 << 16)] -= 1  # the same sum, the same position within a block
    assert block_checksum(moved, np) != base
    assert block_checksum(words, np) == torch_checksum(torch.from_numpy(words))


@pytest.mark.parametrize("mode", ["colocated", "split"])
def test_every_training_step_logs_the_syncs_telemetry(cfg, tmp_path, mode):  # noqa: F811
    from ratchet.stages.train import run_mode

    job = short_job(cfg, mode, tmp_path / mode)
    run_mode(job, mode)
    rows = pd.read_parquet(tmp_path / mode / "metrics.parquet")
    steps = rows[rows["train/reward"].notna()]
    assert (steps["sync/weights_parity"].dropna() == 1.0).all() and steps["sync/weights_parity"].notna().any()
    visible = steps["sync/visible_share"].dropna()
    assert len(visible) and ((visible > 0) & (visible <= 1)).all()  # lr 2e-3: updates cross the grid
    off = steps["sync/masters_off_grid_share"].dropna()
    assert ((off > 0) & (off <= 1)).all()  # fp32 masters leave the fp16 grid


def test_a_stale_sync_sets_weights_parity_to_0(cfg, tmp_path, monkeypatch, capsys):  # noqa: F811
    import ratchet.rl.colocated as colocated

    real_sync, calls = colocated.sync_weights, []

    def stale_after_two(engine, policy):  # the engine stops taking the trainer's weights
        calls.append(1)
        if len(calls) <= 2:
            real_sync(engine, policy)

    monkeypatch.setattr(colocated, "sync_weights", stale_after_two)
    job = short_job(cfg, "colocated", tmp_path / "stale", steps=5)
    colocated.run_colocated(job)
    parity = pd.read_parquet(tmp_path / "stale" / "metrics.parquet")["sync/weights_parity"].dropna().tolist()
    assert parity[:2] == [1.0, 1.0] and parity[2:] == [0.0, 0.0, 0.0]
    assert "sync/weights_parity 0: the engine's" in capsys.readouterr().out


def test_the_gap_by_token_probability_bucket():
    from ratchet.gap import gap_metrics

    engine = np.log(np.array([1e-4, 5e-4, 0.05, 0.3, 0.95, 0.99]))
    trainer = engine + np.array([0.5, 0.1, 0.0, 0.02, 0.001, 0.003])
    m = gap_metrics(engine, trainer)
    assert m["mismatch/by_prob/p_lt_1e-3/token_share"] == pytest.approx(2 / 6)
    assert m["mismatch/by_prob/p_lt_1e-3/logprob_abs_diff_mean"] == pytest.approx(0.3)
    assert m["mismatch/by_prob/p_ge_0.9/logprob_abs_diff_max"] == pytest.approx(0.003)
    assert "mismatch/by_prob/p_0.5_to_0.9/token_share" not in m  # no token there
    shares = [v for k, v in m.items() if k.endswith("token_share")]
    assert sum(shares) == pytest.approx(1.0)


def test_tensors_of_one_flat_buffer_are_summed_in_place_with_the_same_checksums():
    """Tensors at one stride in one buffer (the flat CUDA masters, the engine's buffers) are
    viewed as rows of that buffer rather than stacked into a copy; the checksums and the
    shares a sync reports are those of the stacked copies, and separate tensors still stack."""
    from test_engine import tiny_model

    from ratchet.model.checksum import block_checksums, rows_of
    from ratchet.rl.telemetry import SyncTelemetry, _rows, torch_checksums
    from ratchet.trainer.policy import Policy

    flat = np.random.default_rng(0).integers(-2 ** 15, 2 ** 15, 70_000, dtype=np.int16)
    views = [flat[1000 + i * 9000:1000 + i * 9000 + 7000] for i in range(6)]
    copies = [v.copy() for v in views]
    assert np.shares_memory(rows_of(views, np), flat) and not np.shares_memory(rows_of(copies, np), copies[0])
    assert block_checksums(views, np) == block_checksums(copies, np)
    t = torch.from_numpy(flat.copy())
    shaped = [t[1000 + i * 9000:1000 + i * 9000 + 7000].view(70, 100) for i in range(6)]
    rows = _rows(shaped)
    assert rows.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
    assert torch.equal(rows, torch.stack(shaped))
    assert torch_checksums(shaped) == torch_checksums([s.clone() for s in shaped]) == block_checksums(views, np)

    model = tiny_model()
    apart, flat_policy = (Policy.from_weights(model.cfg, model.weights) for _ in range(2))
    flat_policy.flatten_masters()  # as on CUDA: every parameter a view of one buffer
    flat_policy.load_weights(model.weights)
    assert flat_policy.flat_weights() is not None and apart.flat_weights() is None
    telemetry = [SyncTelemetry(p, "fp16") for p in (apart, flat_policy)]
    for step in range(2):
        found = [m.measure(p) for m, p in zip(telemetry, (apart, flat_policy))]
        assert found[0][1] == found[1][1]
        assert {k: v for k, v in found[0][0].items() if not k.startswith("time/")} == \
            {k: v for k, v in found[1][0].items() if not k.startswith("time/")}
        with torch.no_grad():
            for p in (apart, flat_policy):
                for w in p.parameters():
                    w.add_(torch.full_like(w, 3e-3))
