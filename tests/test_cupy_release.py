"""CuPy's pool hands a finished ablation run's blocks back to the driver (gpu_memory.
release_cupy_cache) and the allocator report keeps the pool's most from before the release;
ablate_fix's runs in one process release after each run, and verify after each mode."""

from __future__ import annotations

import sys
import types

import pandas as pd
import pytest

from ratchet import gpu_memory
from ratchet.mismatch import fix

GIB = 2 ** 30


class FakePool:
    def __init__(self, held: float):
        self.held, self.freed = held, 0

    def total_bytes(self) -> int:
        return int(self.held * GIB)

    def free_all_blocks(self) -> None:
        self.freed += 1
        self.held = 0.25  # what live arrays (the sampler's tables) still hold


@pytest.fixture
def pool(monkeypatch):
    fake = FakePool(25.0)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(get_default_memory_pool=lambda: fake))
    monkeypatch.setattr(gpu_memory, "_cupy_pool_high", 0)
    return fake


def test_a_release_frees_the_pool_and_the_report_keeps_its_most(pool):
    assert gpu_memory.gpu_highs_gib()["cupy pool"] == 25.0
    gpu_memory.release_cupy_cache()
    assert pool.freed == 1 and pool.total_bytes() == 0.25 * GIB
    assert gpu_memory.gpu_highs_gib()["cupy pool"] == 25.0  # its most, not what it holds now
    pool.held = 30.0  # a later run grows it past that
    assert gpu_memory.gpu_highs_gib()["cupy pool"] == 30.0


def test_returning_gpu_memory_releases_the_pool(pool):
    """return_gpu_memory (ablate_decompose's engines released): CuPy's pool among the rest."""
    gpu_memory.return_gpu_memory()
    assert pool.freed == 1 and gpu_memory.gpu_highs_gib()["cupy pool"] == 25.0


def test_without_cupy_a_release_does_nothing(monkeypatch):
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    monkeypatch.setattr(gpu_memory, "_cupy_pool_high", 0)
    gpu_memory.release_cupy_cache()
    assert "cupy pool" not in gpu_memory.gpu_highs_gib()


def test_the_fix_runs_release_the_pool_after_each_run(monkeypatch):
    events = []

    def one_run(setup, settings, name, log=None, laps=None):
        events.append(f"run {name}")
        return pd.DataFrame({"run": [name]}), pd.DataFrame({"run": [name]})

    monkeypatch.setattr(fix, "fix_run", one_run)
    monkeypatch.setattr(gpu_memory, "release_cupy_cache", lambda: events.append("release"))
    steps, runs = fix.fix_runs(None, types.SimpleNamespace(fix_runs=("none", "fix", "exact")))
    assert events == ["run none", "release", "run fix", "release", "run exact", "release"]
    assert list(runs["run"]) == ["none", "fix", "exact"] and list(steps["run"]) == ["none", "fix", "exact"]


def test_verify_releases_the_pool_after_each_mode(monkeypatch, tmp_path):
    """verify reruns both modes in one process: the pool hands the first mode's blocks back
    before the second starts, and after it, with the verdicts as before; each mode is its
    training's job, shortened."""
    import json

    from ratchet.stages import verify as verify_stage

    events = []
    trace = pd.DataFrame({"step": [0, 1], **{q: ["0x1p+0", "0x1p+1"] for q in verify_stage.QUANTITIES}})
    paths = types.SimpleNamespace(root=tmp_path, verify_dir=tmp_path / "verify", verify_json=tmp_path / "verify.json",
                                  train_trace=lambda mode: tmp_path / f"{mode}.parquet")
    for mode in verify_stage.MODES:
        trace.to_parquet(paths.train_trace(mode))

    def rerun(out, mode):
        events.append(f"run {mode}")
        out.mkdir(parents=True)
        trace.to_parquet(out / "trace.parquet")

    monkeypatch.setattr(verify_stage, "RunPaths", types.SimpleNamespace(from_config=lambda cfg: paths))
    overrides = []
    monkeypatch.setattr(verify_stage, "make_job", lambda cfg, mode, out_dir, **kw: overrides.append(kw) or out_dir)
    monkeypatch.setattr(verify_stage, "run_mode", rerun)
    monkeypatch.setattr(gpu_memory, "release_cupy_cache", lambda: events.append("release"))
    run = types.SimpleNamespace(log_metrics=lambda m: None, set_tags=lambda t: None, log_output=lambda p: None)
    verify_stage.verify({"train": {"verify_steps": 2, "steps": 5}}, run)
    assert events == [e for mode in verify_stage.MODES for e in (f"run {mode}", "release")]
    assert json.loads(paths.verify_json.read_text())["identical"] is True
    # the trainings' own jobs but for their length, evals and files: the same memory a pass (the
    # recompute, the micro-batches, the engine's rows), so a profile states verify at a training's
    assert {k for kw in overrides for k in kw} == {"steps", "eval_every", "checkpoints", "save_model", "resume"}


@pytest.mark.gpu
def test_on_the_gpu_the_fix_runs_leave_no_cached_block_in_the_pool(tmp_path):
    """On CUDA, three fix runs in one process (the exact fix's batch-invariant engine between two
    of the fast one) leave CuPy's pool holding only live arrays, where without the release it
    keeps every dropped engine's blocks; the report's high-water is at least a run's engines."""
    import dataclasses

    import cupy
    from configured import ablate_settings
    from tiny_setup import tiny_setup

    settings = ablate_settings(updates=(0,), num_rollouts=4, max_new_tokens=4, problems_per_step=2, group_size=4,
                               lr=1e-6, engine_dtypes=("fp16",), seed=0, engine_dtype="fp16", micro_batch_size=4,
                               fix_steps=1, fix_runs=("none", "exact", "tis"))
    setup = dataclasses.replace(tiny_setup(tmp_path, num_measure=4), backend="cuda", device="cuda")
    pool = cupy.get_default_memory_pool()
    steps, runs = fix.fix_runs(setup, settings)
    assert list(runs["run"]) == ["none", "exact", "tis"]
    assert pool.total_bytes() == pool.used_bytes() and pool.n_free_blocks() == 0
    assert gpu_memory.gpu_highs_gib()["cupy pool"] * GIB > pool.used_bytes()
