"""Engines released during the gradient passes (idle_engines.py): the three studies' rows are
the bits of a run that keeps every engine, the released engines are made again only where
used, and MeasuringEngines makes each on first use."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from configured import ablate_settings
from tiny_setup import tiny_setup

from ratchet.mismatch.ablation import Setup
from ratchet.mismatch.decompose import IDLE_LAP, along_updates
from ratchet.mismatch.idle_engines import MeasuringEngines
from ratchet.rl.runtime import Laps

SETTINGS = dict(updates=(0, 3), gradient_updates=(0, 1, 3), num_rollouts=8, max_new_tokens=4,
                problems_per_step=4, group_size=8, lr=1e-6, engine_dtypes=("fp16", "bf16"),
                visibility_updates=3, max_steps_per_update=30, seed=0, engine_dtype="fp16",
                micro_batch_size=5)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    setup = tiny_setup(tmp_path_factory.mktemp("tiny"), num_measure=SETTINGS["num_rollouts"])
    yield setup
    torch.set_num_threads(threads)


@pytest.fixture
def made(monkeypatch):
    """Every engine the ablation makes, in order: (backend, dtype, a weak reference to it)."""
    import weakref

    made, engine = [], Setup.engine

    def counted(self, dtype, *args, backend=None, **kwargs):
        out = engine(self, dtype, *args, backend=backend, **kwargs)
        made.append((backend or self.backend, dtype, weakref.ref(out)))
        return out

    monkeypatch.setattr(Setup, "engine", counted)
    return made


def test_released_engines_give_the_same_rows(tiny, made):
    """Each dtype's passes run with the other engines and the trajectory's dropped: the
    decomposition, the visibility and the gradients are the bits of the run that holds them all,
    and the engines dropped are made again where next used (the trajectory's once a step follows,
    on the converted weights before the first step, synced after)."""
    settings = ablate_settings(**SETTINGS)
    kept = along_updates(tiny, settings, gradient_at=settings.gradient_updates, release_idle_engines=False)
    made.clear()
    laps = Laps()
    released = along_updates(tiny, settings, gradient_at=settings.gradient_updates, laps=laps,
                             release_idle_engines=True)
    for a, b in zip(kept, released):
        assert a.equals(b) and len(a)
    assert IDLE_LAP in laps.laps
    # at the start: the trajectory's (fp16) and one a dtype; then after each of the gradient points
    # 0, 1 and 3: bf16's passes need it back (fp16's dropped), the trajectory's for the steps
    # to update 1 and 3 (the measuring engines dropped through them), fp16's for update 1's
    # gradients, both for update 3's sources
    dtypes = [dtype for _, dtype, _ in made]
    assert dtypes == ["fp16", "fp16", "bf16",
                      "bf16",  # update 0's bf16 passes
                      "fp16", "fp16", "bf16",  # the steps to update 1, its fp16 and bf16 passes
                      "fp16",  # the steps to update 3
                      "fp16", "bf16",  # update 3's sources
                      "bf16"]  # update 3's bf16 passes


def test_a_released_engine_is_gone_when_its_memory_is_returned(tiny, made, monkeypatch):
    """A released engine is gone by the time its memory is handed back, not only out of the
    table: no name keeps it (a loop's variable did in the fortieth session's first 1.5B run,
    so CuPy's pool kept its blocks through the next dtype's passes), and in the passes only
    their own engine is alive."""
    import gc

    from ratchet.mismatch import decompose, gradient

    settings = ablate_settings(**SETTINGS)
    batch_rows, return_gpu_memory = gradient.batch_rows, decompose.return_gpu_memory

    def alive():
        gc.collect()
        return [r() for _, _, r in made if r() is not None]

    at_return, checked = [], []

    def returned():
        at_return[:] = [id(e) for e in alive()]  # (not the engines: a name here would keep them)
        return_gpu_memory()

    def passes(policy, engine, *args, **kwargs):
        # when the memory went back, at most this dtype's engine was alive (made again after)
        checked.append(set(at_return) <= {id(engine)} and [id(e) for e in alive()] == [id(engine)])
        return batch_rows(policy, engine, *args, **kwargs)

    monkeypatch.setattr(decompose, "return_gpu_memory", returned)
    monkeypatch.setattr(gradient, "batch_rows", passes)
    along_updates(tiny, settings, gradient_at=settings.gradient_updates, release_idle_engines=True)
    assert checked == [True] * 6  # 3 points x 2 dtypes


@pytest.mark.parametrize("release", [True, False])
def test_the_steps_after_the_passes_run_beside_no_measuring_engine(tiny, made, monkeypatch, release):
    """The GRPO steps between two gradient points sample from the trajectory's engine alone: the
    measuring engine the last passes kept is dropped through them (at 1.5B it held 5 GiB there,
    ablate_decompose's peak), and made again for the next measurement. Held, it is alive there."""
    import gc

    from ratchet.mismatch.ablation import Trajectory

    settings = ablate_settings(**SETTINGS)
    step, beside = Trajectory.train_step, []

    def counted(traj, *args, **kwargs):
        gc.collect()
        beside.append(len([r for _, _, r in made if r() is not None and r() is not traj.engine]))
        return step(traj, *args, **kwargs)

    monkeypatch.setattr(Trajectory, "train_step", counted)
    along_updates(tiny, settings, gradient_at=settings.gradient_updates, release_idle_engines=release)
    assert beside and all(n == 0 for n in beside) == release, beside


def test_a_vllm_engine_beside_it_is_kept(tiny, made, monkeypatch):
    """vLLM's measuring engine (ablate_decompose_vllm) is never released: one such engine a
    process, slow to make; ratchet's own of the other dtype is."""
    import fake_vllm

    fake_vllm.install(monkeypatch, vocab=tiny.model.cfg.vocab_size)
    fake_vllm.FakeLLM.instances.clear()
    settings = ablate_settings(**{**SETTINGS, "updates": (0, 1), "gradient_updates": (0,)})
    along_updates(tiny, settings, visibility_updates=0, backends=("numpy", "vllm"),
                  gradient_at=settings.gradient_updates, release_idle_engines=True)
    keys = [(backend, dtype) for backend, dtype, _ in made]
    assert keys.count(("vllm", "fp16")) == keys.count(("vllm", "bf16")) == 1
    # released through fp16's passes, made again for its own, dropped through the step to update 1,
    # made again for its sources
    assert keys.count(("numpy", "bf16")) == 3


def test_the_default_releases_only_on_a_cuda_setup(tiny):
    """None: off on the NumPy engine (host memory is not what limits it), so no engine is made again."""
    settings = ablate_settings(**{**SETTINGS, "updates": (0,), "gradient_updates": (0, 1)})
    laps = Laps()
    along_updates(tiny, settings, visibility_updates=0, gradient_at=settings.gradient_updates, laps=laps)
    assert IDLE_LAP not in laps.laps


def test_measuring_engines_are_made_on_first_use_and_again_after_release():
    made = []
    engines = MeasuringEngines(lambda key: made.append(key) or object(), ["a", "b"])
    assert made == [] and engines.keys() == ["a", "b"] and engines.released()
    first = engines["a"]
    assert engines["a"] is first and made == ["a"]
    engines.make_all()
    assert made == ["a", "b"] and not engines.released()
    engines.release(keep=["b"])
    assert engines.released()
    assert made == ["a", "b"]  # nothing is made by a release
    engines.make("b")
    assert made == ["a", "b"]  # kept
    assert engines["a"] is not first and made == ["a", "b", "a"]
    engines.add("c")
    engines.make_all()
    assert engines.keys() == ["a", "b", "c"] and made == ["a", "b", "a", "c"]


@pytest.mark.gpu
def test_on_the_gpu_the_passes_run_without_the_idle_engines(tiny):
    """On CUDA (the default there): the same rows as a run that holds every engine, and CuPy's
    pool holds less once a dtype's gradients are done (its engine alone, the others returned)."""
    import cupy

    cuda = dataclasses.replace(tiny, backend="cuda", device="cuda")
    settings = ablate_settings(**SETTINGS)
    pool = cupy.get_default_memory_pool()
    held = {}

    def run(release):
        def log_gradient(dtype, updates, rows):
            held.setdefault(release, []).append(pool.total_bytes())
        return along_updates(cuda, settings, gradient_at=settings.gradient_updates, log_gradient=log_gradient,
                             release_idle_engines=release)

    kept, released = run(False), run(None)
    for a, b in zip(kept, released):
        assert a.equals(b) and len(a)
    assert len(held[None]) == len(held[False]) == 6  # 3 points x 2 dtypes
    assert all(r < k for r, k in zip(held[None], held[False])), (held[None], held[False])


def test_off_the_gpu_an_engine_starts_on_the_converted_weights(tiny):
    """`masters` is for a CUDA engine and masters on its GPU: a NumPy engine, or masters on the
    host, start on the converted weights as before (the caller's sync moves them)."""
    from ratchet.mismatch.ablation import Trajectory
    from ratchet.rl.sync import device_masters

    traj = Trajectory(tiny, ablate_settings(**SETTINGS).grpo("none"))
    traj.advance_to(1)
    assert device_masters(traj.policy) is None
    assert tiny.engine("fp16", masters=traj.policy).weight_checksums() == tiny.engine("fp16").weight_checksums()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_on_the_gpu_an_engine_started_on_the_masters_holds_a_synced_engines_bits(tiny, dtype):
    """A CUDA engine made with `masters` starts on them, rounded on the GPU: before any update
    the bits of the converted weights rounded on the host, after one the bits of an engine made
    on those and synced (what the ablations did before: ~1 s of host work an engine at 1.5B)."""
    from ratchet.mismatch.ablation import Trajectory
    from ratchet.rl.sync import device_masters, sync_weights

    cuda = dataclasses.replace(tiny, backend="cuda", device="cuda")
    traj = Trajectory(cuda, ablate_settings(**{**SETTINGS, "lr": 1e-3}).grpo("none"))  # steps bf16 sees
    assert device_masters(traj.policy) is not None
    host_start = cuda.engine(dtype)
    converted = host_start.weight_checksums()
    assert cuda.engine(dtype, masters=traj.policy).weight_checksums() == converted
    traj.advance_to(1)
    sync_weights(host_start, traj.policy)
    synced = host_start.weight_checksums()
    assert synced != converted  # the update moved some weight across the grid
    assert cuda.engine(dtype, masters=traj.policy).weight_checksums() == synced
