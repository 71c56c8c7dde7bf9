"""The CUDA backend's host side on a CPU: CudaBackend driving NumPy stand-ins of CuPy and of
its kernels (tests/fake_cupy.py, built from the NumPy backend's layers) must give the NumPy
engine's tokens and log-probabilities bit for bit, through its staging, fed tokens, captured
graphs, buckets, packed prefill passes and teacher forcing. The kernels themselves are
tests/test_cuda_engine.py's, on the GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PRELUDE = """
import json
import numpy as np
import fake_cupy
fake_cupy.install()
from random_model import FakeModel, random_weights
from ratchet.engine.cuda.backend import CudaBackend
from ratchet.engine.engine import Engine
from ratchet.engine.numpy.backend import NumpyBackend
from ratchet.engine.request import Request
from ratchet.engine.sampling import SamplingBatch
from test_engine import tiny_config

def workload(temperature=None):
    r = np.random.default_rng(0)
    return [Request(i, r.integers(0, 64, int(r.integers(2, 30))).tolist(), max_new_tokens=int(r.integers(1, 25)),
                    temperature=temperature or float(r.uniform(0.6, 1.4)), greedy=i % 4 == 3, seed=i % 3)
            for i in range(9)]

def generations(reqs):
    return [(r.output, r.logprobs, r.finish_reason) for r in reqs]
"""


def on_fake_gpu(code: str):
    """The JSON that `code` prints, run after PRELUDE in a fresh interpreter (the fake CuPy
    must not reach this process' modules)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    out = subprocess.run([sys.executable, "-c", PRELUDE + code], capture_output=True, text=True, cwd=ROOT,
                         env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_engine_on_fake_kernels_equals_numpy_engine():
    """Every decode path (fused or separate RoPE, graphs or eager, overlapped or plain) with
    eos stops and more requests than slots; split-K off (its slices sum in another order)."""
    results = on_fake_gpu("""
out = {}
for dtype in ("fp16", "fp32"):
    model = FakeModel(tiny_config(), random_weights(tiny_config(), 3, dtype), dtype)
    want = generations(Engine(model, max_batch_size=4, max_seq_len=128, eos_ids=[5]).generate(workload()))
    for fused in (True, False):
        fake_cupy.FakeOps.fused = fused
        for graphs in (True, False):
            for overlap in (True, False):
                engine = Engine(model, backend="cuda", max_batch_size=4, max_seq_len=128, eos_ids=[5],
                                overlap=overlap)
                engine.backend.use_graphs, engine.backend.split_products = graphs, ()
                got = generations(engine.generate(workload()))
                out[f"{dtype} fused={fused} graphs={graphs} overlap={overlap}"] = got == want
    out["eos stops"] = sum(g[2] == "eos" for g in want)
print(json.dumps(out))
""")
    assert results.pop("eos stops") >= 2
    assert all(results.values()), results


def test_packed_prefill_feed_and_forced_rows_equal_numpy_backend():
    results = on_fake_gpu("""
cfg = tiny_config()
weights = random_weights(cfg, 4, "fp16")
cuda, ref = CudaBackend(cfg, "fp16", 8, 128, prefill_chunk=16), NumpyBackend(cfg, "fp16", 8, 128)
cuda.split_products = ()
for be in (cuda, ref):
    be.load_weights(weights)
rng = np.random.default_rng(5)
slots, prompts = [4, 0, 6, 2, 7], [rng.integers(0, 64, n).tolist() for n in (3, 40, 17, 1, 25)]
out = {"prefill": cuda.prefill_batch(slots, prompts).tobytes() == ref.prefill_batch(slots, prompts).tobytes()}
lengths = [len(p) for p in prompts]
first = SamplingBatch([1] * 5, [10, 11, 12, 13, 14], [0] * 5, [1.0, 0.7, 1.0, 0.0, 1.3], [0, 0, 0, 1, 0])
drawn = {be: be.decode_sample_async(slots, [1, 2, 3, 4, 5], lengths, first).result() for be in (cuda, ref)}
forced = SamplingBatch([1] * 4, [10, 11, 12, 13], [1] * 4, [1.0, 0.7, 1.0, 0.0], [0, 0, 0, 1], forced=[3, -1, 7, -1])
fed = {be: be.decode_sample_async(slots[:4], [0] * 4, [n + 1 for n in lengths[:4]], forced, feed=[3, 2, 1, 0]).result()
       for be in (cuda, ref)}
for name, got in (("drawn", drawn), ("fed and forced", fed)):
    out[name] = all(got[cuda][i].tobytes() == got[ref][i].tobytes() for i in range(2))
print(json.dumps(out))
""")
    assert all(results.values()), results


def test_batch_invariant_backend_scores_its_rollouts_bit_for_bit():
    results = on_fake_gpu("""
model = FakeModel(tiny_config(), random_weights(tiny_config(), 3, "fp16"), "fp16")
engine = Engine(model, backend="cuda", max_batch_size=4, max_seq_len=128, eos_ids=[], batch_invariant=True)
reqs = engine.generate(workload(temperature=0.9))
scored = engine.score([r.prompt for r in reqs], [r.output for r in reqs], 0.9, batch_size=3)
print(json.dumps({"buckets": engine.backend.buckets, "same": scored == [r.logprobs for r in reqs]}))
""")
    assert results == {"buckets": [4], "same": True}


def test_the_engine_stream_takes_the_devices_highest_priority_unless_told_not_to():
    results = on_fake_gpu("""
import os
cfg = tiny_config()
high = CudaBackend(cfg, "fp16", 4, 64).stream.priority
os.environ["RATCHET_STREAM_PRIORITY"] = "0"
plain = CudaBackend(cfg, "fp16", 4, 64).stream.priority
print(json.dumps({"high": high, "plain": plain}))
""")
    assert results == {"high": -5, "plain": None}  # the fake device's range is (0, -5)


def test_one_kernel_telemetry_glue_on_fake_kernels():
    """ratchet/engine/cuda/telemetry.py's host side (descriptors, the held buffer's offsets, the
    start from held words, the read-back) around a NumPy sync_telemetry that reads and writes
    the memory its descriptors point at: the counts and checksums of torch's path over updates,
    from the masters and from held values; the engine buffers' checksums NumPy's."""
    results = on_fake_gpu("""
import torch
from ratchet.engine.cuda import telemetry
from ratchet.model.checksum import block_checksums
from ratchet.rl.telemetry import SyncTelemetry

class Masters:
    def __init__(self, w):
        self.w = w
    def export_weights(self):
        return self.w

out = {}
for dtype, tdtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
    torch.manual_seed(0)
    w = {k: torch.randn(n) * 0.05 for k, n in (("a", 1), ("b", 8191), ("c", 8193), ("d", 2 * 65536 + 5), ("e", 20000))}
    w["b"][:100] = w["b"][:100].to(tdtype).float()  # on the grid
    for held in (None, {k: (v * 0.999).to(tdtype) for k, v in w.items()}):
        plain = SyncTelemetry(Masters(w), dtype, held=held, fused=False)
        words = None if held is None else {k: v.view(torch.int16) for k, v in held.items()}
        fused = telemetry.MasterTelemetry(w, dtype, words)
        for scale in (1.0, 1 + 1e-6, 1 + 1e-3):
            with torch.no_grad():
                for v in w.values():
                    v.mul_(scale)
            shares, sums = plain.measure(Masters(w))
            changed, off, found = fused.measure(w)
            total = sum(fused.sizes)
            key = f"{dtype} {'held' if held else 'start'} {scale}"
            out[key] = [found == sums, changed / total == shares["sync/visible_share"],
                        off / total == shares["sync/masters_off_grid_share"], changed]
rng = np.random.default_rng(1)
buffers = [fake_cupy.cp.asarray(rng.standard_normal(n).astype(t)) for n, t in
           ((3, np.float16), (70000, np.float16), (8192, np.float16), (100, np.float32))]
out["buffers"] = telemetry.buffer_checksums(buffers) == block_checksums([np.asarray(b).view(np.int16) for b in buffers], np)
print(json.dumps(out))
""")
    assert results.pop("buffers") is True
    for key, (same_sums, same_visible, same_off, changed) in results.items():
        assert same_sums and same_visible and same_off, key
    assert results["fp16 start 1.0"][3] == 0 and results["fp16 start 1.001"][3] > 0
    assert results["bf16 held 1.0"][3] > 0  # the held values were not the masters rounded


def test_a_used_engine_is_freed_when_its_last_reference_goes():
    """An engine's GPU buffers (KV cache, weights, captured graphs) go back to CuPy's pool when
    the engine's last reference does, without waiting for Python's cycle collector: the fix
    runs and learning runs of an ablation each make engines of several GiB at 1.5B, and a cycle
    through the backend (its graph cache holding its bound decode method) kept them until the
    collector's next full pass."""
    results = on_fake_gpu("""
import gc, weakref
gc.disable()
out = {}
model = FakeModel(tiny_config(), random_weights(tiny_config(), 3, "fp16"), "fp16")
for invariant in (False, True):
    engine = Engine(model, backend="cuda", max_batch_size=4, max_seq_len=128, eos_ids=[5],
                    batch_invariant=invariant)
    engine.generate(workload())
    captured = len(engine.backend._graphs.graphs)
    backend, kv = weakref.ref(engine.backend), weakref.ref(engine.backend.kv)
    del engine
    out[f"invariant={invariant}"] = [captured, backend() is None, kv() is None]
print(json.dumps(out))
""")
    for key, (captured, backend_freed, kv_freed) in results.items():
        assert captured > 0, key  # decode steps ran through captured graphs
        assert backend_freed and kv_freed, key
