"""An ablation run's trainer (fp32 masters, AdamW's moments) and engines go when the run's last
reference does, not at the cycle collector's next full pass: ablate_fix and ablate_learning
run one after another in one process, and at 1.5B each run holds tens of GiB of GPU memory.
Checked in a fresh interpreter with the collector off, where the first run is the one that
torch's lazy imports used to keep (ratchet.trainer.policy.import_dynamo)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CODE = """
import dataclasses, gc, json, sys, tempfile, weakref
from pathlib import Path
from configured import ablate_settings
from tiny_setup import tiny_setup
from ratchet.mismatch.ablation import Trajectory

assert "torch._dynamo" not in sys.modules  # the first run is the one a lazy import would catch
settings = ablate_settings(updates=(0,), num_rollouts=4, max_new_tokens=4, problems_per_step=2, group_size=4,
                           lr=1e-6, engine_dtypes=("fp16",), seed=0, engine_dtype="fp16", micro_batch_size=4,
                           fix_steps=1, fix_runs=("exact",))
setup = tiny_setup(Path(tempfile.mkdtemp()), num_measure=4)
ON_GPU = {on_gpu}
if ON_GPU:
    import cupy, torch
    setup = dataclasses.replace(setup, backend="cuda", device="cuda")

def held_bytes():
    if not ON_GPU:
        return 0
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated() + cupy.get_default_memory_pool().used_bytes()

gc.collect()
gc.disable()
out = {}
for run in ("exact", "none", "exact again"):
    traj = Trajectory(setup, settings.grpo(run.split()[0]))
    traj.train_step()
    held = {k: weakref.ref(getattr(traj, k)) for k in ("policy", "optimizer", "engine")}
    held["masters"] = weakref.ref(next(traj.policy.parameters()))
    del traj
    out[run] = {k: r() is None for k, r in held.items()}
    out[run]["bytes after"] = held_bytes()
print(json.dumps(out))
"""


def freed_runs(on_gpu: bool) -> dict:
    paths = [str(ROOT), str(ROOT / "tests"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    done = subprocess.run([sys.executable, "-c", CODE.replace("{on_gpu}", str(on_gpu))], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


EVERY = ("policy", "optimizer", "engine", "masters")
RUNS = ("exact", "none", "exact again")


def check(freed: dict) -> None:
    """Every run's objects gone with it, and no run leaves more held than the first (which
    keeps what a process makes once: cuBLAS's workspace, compiled kernels' tables)."""
    assert list(freed) == list(RUNS)
    assert all(freed[run][k] for run in RUNS for k in EVERY), freed
    assert {freed[run]["bytes after"] for run in RUNS} == {freed["exact"]["bytes after"]}, freed


def test_a_run_is_freed_with_its_last_reference():
    check(freed_runs(on_gpu=False))


@pytest.mark.gpu
def test_a_run_on_the_gpu_gives_back_its_memory_with_its_last_reference():
    """The same on CUDA, where torch's allocated bytes and CuPy's pool in use after each run are
    those after the first (the CUDA engine's graph cache held its backend in a cycle, and
    use_deterministic_algorithms imported dynamo with the first run's frames)."""
    check(freed_runs(on_gpu=True))
