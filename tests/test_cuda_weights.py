"""The CUDA engine's weights on the GPU: the in-place sync (DLPack, rounded on the GPU) bit
equal to a reload, and the engine against the trainer on the engine's own weights at
Qwen2.5-0.5B shapes. Run on the GPU machine: `pytest -m gpu`; skipped elsewhere."""

from __future__ import annotations

import numpy as np
import pytest
from random_model import random_weights
from test_cuda_engine import host, small_config

from ratchet.engine.sampling import SamplingBatch
from ratchet.model.dtypes import round_to
from ratchet.model.layout import expected_shapes

pytestmark = pytest.mark.gpu


# ------------------------------------------------------------------ weight sync


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_cuda_checksums_are_the_numpy_engines_and_torchs(dtype):
    """sync/weights_parity compares these: the CUDA buffers' checksums against the masters
    rounded by torch, and against the NumPy engine holding the same weights."""
    import torch

    from ratchet.engine.cuda.backend import CudaBackend
    from ratchet.engine.numpy.backend import NumpyBackend
    from ratchet.rl.telemetry import torch_checksum
    from ratchet.trainer.precision import torch_dtype

    cfg = small_config("a")
    masters = random_weights(cfg, seed=5)  # fp32, off every 16-bit grid
    cuda, reference = CudaBackend(cfg, dtype, 4, 64), NumpyBackend(cfg, dtype, 4, 64)
    cuda.load_weights({k: round_to(v, dtype) for k, v in masters.items()})
    reference.load_weights({k: round_to(v, dtype) for k, v in masters.items()})
    cuda.update_weights({k: torch.from_numpy(v).cuda() for k, v in masters.items()})  # rounded on the GPU
    held = cuda.weight_checksums()
    assert held == reference.weight_checksums()
    for name, w in masters.items():
        assert held[name] == torch_checksum(torch.from_numpy(w).cuda().to(torch_dtype(dtype))), name


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_inplace_sync_bit_equal_to_reload(dtype):
    import cupy as cp
    import torch

    from ratchet.engine.cuda.backend import CudaBackend

    cfg = small_config("a")
    torch.manual_seed(0)
    masters = {name: torch.randn(shape, device="cuda") * 0.3 for name, shape in expected_shapes(cfg).items()}
    masters["embed.weight"][0, :4] = torch.tensor([65519.0, 1e-8, -3.0e38, 0.33333334])  # edges
    synced = CudaBackend(cfg, dtype, 4, 128)
    synced.load_weights(random_weights(cfg, 1, dtype))  # old weights, then the in-place sync
    for step in range(2):  # the second sync reuses the descriptors (same tensors, updated in place)
        if step:
            with torch.no_grad():
                for t in masters.values():
                    t.mul_(-0.75).add_(0.01)
        synced.update_weights(masters)
        reloaded = CudaBackend(cfg, dtype, 4, 128)
        reloaded.load_weights({k: round_to(v.cpu().numpy(), dtype) for k, v in masters.items()})
        for name in expected_shapes(cfg):
            a, b = synced.weights[name], reloaded.weights[name]
            assert bool(cp.all(a.view(cp.uint16 if a.dtype != cp.float32 else cp.uint32)
                               == b.view(cp.uint16 if b.dtype != cp.float32 else cp.uint32))), (step, name)
        prompt = list(range(1, 40))
        np.testing.assert_array_equal(host(synced.prefill(0, prompt)), host(reloaded.prefill(0, prompt)))


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_flat_masters_sync_as_one_range_and_a_subset_as_several(dtype):
    """The trainer's CUDA masters (one flat buffer) into the engine's flat buffers: one range,
    convert_f32; every other tensor alone: no range merges across the ones left out, which
    keep their bits. Both bit for bit what a reload of the rounded masters gives."""
    import cupy as cp
    import torch

    from ratchet.engine.cuda.backend import CudaBackend
    from ratchet.trainer.policy import Policy

    cfg = small_config("a")
    policy = Policy.from_weights(cfg, random_weights(cfg, seed=3), device="cuda")
    engine = CudaBackend(cfg, dtype, 4, 64)
    engine.load_weights(random_weights(cfg, 1, dtype))

    def held(name) -> np.ndarray:
        return cp.asnumpy(engine.weights[name].view(cp.uint16))

    def rounded(t) -> np.ndarray:  # the 16-bit pattern of the master rounded on the host
        r = round_to(t.cpu().numpy(), dtype)
        return (r.view(np.uint32) >> 16).astype(np.uint16) if dtype == "bf16" else r.astype(np.float16).view(np.uint16)

    masters = policy.export_weights()
    engine.update_weights(masters)
    assert engine.weight_sync._plan.range is not None  # the whole sync: one range
    for name, t in masters.items():
        np.testing.assert_array_equal(held(name), rounded(t), err_msg=name)
    before = {name: held(name) for name in masters}
    with torch.no_grad():
        for t in masters.values():
            t.add_(0.125)
    engine.update_weights({name: t for i, (name, t) in enumerate(masters.items()) if i % 2})
    assert engine.weight_sync._plan.range is None
    for i, (name, t) in enumerate(masters.items()):
        np.testing.assert_array_equal(held(name), rounded(t) if i % 2 else before[name], err_msg=name)


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_the_policys_flat_buffer_syncs_in_one_launch_bit_for_bit_as_its_mapping(dtype):
    """rl.sync.sync_weights hands the engine the policy's one flat buffer (FlatWeights): one
    check and one launch into the engine's flat buffer. Bits equal the same masters passed as
    a mapping of views, at every step; a buffer of another model or dtype is refused by name."""
    import dataclasses
    from types import SimpleNamespace

    import cupy as cp
    import torch

    from ratchet.engine.cuda.backend import CudaBackend
    from ratchet.errors import InputError
    from ratchet.model.flat_weights import FlatWeights
    from ratchet.rl.sync import sync_weights
    from ratchet.trainer.policy import Policy

    cfg = small_config("a")
    policy = Policy.from_weights(cfg, random_weights(cfg, seed=6), device="cuda")
    flat_engine, mapped_engine = CudaBackend(cfg, dtype, 4, 64), CudaBackend(cfg, dtype, 4, 64)
    for e in (flat_engine, mapped_engine):
        e.load_weights(random_weights(cfg, 1, dtype))

    holder = SimpleNamespace(weight_device=flat_engine.weight_device,  # what sync_weights asks of an engine
                             update_weights=flat_engine.update_weights)

    for step in range(3):
        if step:
            with torch.no_grad():
                for t in policy.export_weights().values():
                    t.mul_(1.0 + 1e-3 * step).add_(1e-4)
        sync_weights(holder, policy)
        mapped_engine.update_weights(dict(policy.export_weights()))
        assert flat_engine.flat_sync is not None and flat_engine.weight_sync is None  # never the mapping path
        view = cp.uint32 if dtype == "fp32" else cp.uint16
        for name in expected_shapes(cfg):
            assert bool(cp.all(flat_engine.weights[name].view(view) == mapped_engine.weights[name].view(view))), \
                (step, name)
    assert flat_engine.weight_checksums() == mapped_engine.weight_checksums()
    other = dataclasses.replace(cfg, rms_norm_eps=cfg.rms_norm_eps * 2)
    with pytest.raises(InputError, match="another model configuration"):
        flat_engine.update_weights(FlatWeights(other, policy.flat_weights().flat))
    with pytest.raises(ValueError, match="source dtype"):
        flat_engine.update_weights(FlatWeights(cfg, policy.flat_weights().flat.double()))


@pytest.mark.parametrize("kernel", ["search", "default", "table"])
def test_a_repeated_sync_reuses_its_coalesced_plan_with_every_kernel(kernel):
    """Flat masters synced twice through one WeightSync (the second reuses the plan made from
    the coalesced ranges), the masters changed in between: bits equal the host's rounding."""
    import cupy as cp
    import torch

    from ratchet.engine.cuda import sync
    from ratchet.engine.cuda.backend import CudaBackend
    from ratchet.trainer.policy import Policy

    cfg = small_config("a")
    policy = Policy.from_weights(cfg, random_weights(cfg, seed=4), device="cuda")
    engine = CudaBackend(cfg, "fp16", 4, 64)
    engine.load_weights(random_weights(cfg, 1, "fp16"))
    choice = {"search": sync.SEARCH, "default": sync.DEFAULT_KERNEL,
              "table": sync.SyncKernel("table", 8192, 4, stream=False, per_chunk=True)}[kernel]
    weight_sync = sync.WeightSync(engine.weights, "fp16", kernel=choice)
    masters = policy.export_weights()
    for step in range(2):
        if step:
            with torch.no_grad():
                for t in masters.values():
                    t.mul_(-0.75).add_(0.01)
        weight_sync.copy(list(masters.items()))
        cp.cuda.runtime.deviceSynchronize()
        for name, t in masters.items():
            np.testing.assert_array_equal(cp.asnumpy(engine.weights[name]).view(np.uint16),
                                          round_to(t.cpu().numpy(), "fp16").astype(np.float16).view(np.uint16),
                                          err_msg=f"{kernel} sync {step}: {name}")


@pytest.mark.parametrize("kernel", ["search", "default", "table-8192-4-1-0", "table-4096-4-0-1", "table-1024-8-0-1"])
def test_copy_many_odd_sizes_misaligned_sources(kernel):
    """One launch over tensors of odd sizes (chunk edges, tails), torch tensors (pointer path)
    and CuPy views starting off a 16-byte boundary (DLPack path): bits equal round_to's, with
    each conversion kernel the sync bench compares."""
    import cupy as cp
    import torch

    from ratchet.engine.cuda import sync
    from ratchet.model.dtypes import fp32_to_bf16_bits

    torch.manual_seed(1)
    sizes = [1, 7, 8, 8191, 8192, 8193, 100003, 3 * 8192 + 5]
    for dtype, storage in (("fp16", np.float16), ("bf16", np.uint16), ("fp32", np.float32)):
        srcs = [torch.randn(n, device="cuda") * 100 for n in sizes]
        srcs[0][0] = float("nan")
        base = cp.asarray(np.random.default_rng(2).standard_normal(5001).astype(np.float32))
        srcs += [base[1:], base[3:4003]]  # CuPy views 4 and 12 bytes off the allocation
        bufs = [cp.zeros(int(np.prod(t.shape)), dtype=storage) for t in srcs]
        name, *rest = kernel.split("-")
        choice = sync.SEARCH if name == "search" else sync.DEFAULT_KERNEL if name == "default" \
            else sync.SyncKernel("table", *map(int, rest[:2]), *map(bool, map(int, rest[2:])))
        sync.copy_many(list(zip(bufs, srcs)), dtype, kernel=choice)
        cp.cuda.runtime.deviceSynchronize()
        for buf, src in zip(bufs, srcs):
            host = src.cpu().numpy() if isinstance(src, torch.Tensor) else cp.asnumpy(src)
            if dtype == "fp16":
                with np.errstate(over="ignore"):
                    want = host.astype(np.float16).view(np.uint16)
            elif dtype == "bf16":
                want = fp32_to_bf16_bits(host)
            else:
                want = host.view(np.uint32)
            got = cp.asnumpy(buf).view(want.dtype)
            nan = np.isnan(host)
            np.testing.assert_array_equal(got[~nan], want[~nan], err_msg=f"{dtype} size {host.size}")
            if dtype != "fp32":
                assert np.all(np.isnan(cp.asnumpy(buf)[nan].astype(np.float32) if dtype == "fp16"
                                       else (cp.asnumpy(buf)[nan].astype(np.uint32) << 16).view(np.float32)))


@pytest.mark.parametrize("loads", [0, 2, 4])
def test_one_range_kernels_round_every_value_once_at_odd_sizes_and_misaligned(loads):
    """A single (buffer, tensor) pair is one range: convert_f32 (loads 0) or convert_tiles
    (1,024 x loads values a block, the last n % 4 by the last tile's block). Sizes at and
    around the tile edges, and CuPy views off a 16-byte boundary (the scalar path): bits equal
    round_to's, and nothing past the end is written."""
    import dataclasses

    import cupy as cp
    import torch

    from ratchet.engine.cuda import sync
    from ratchet.model.dtypes import fp32_to_bf16_bits

    kernel = dataclasses.replace(sync.DEFAULT_KERNEL, range_loads=loads)
    torch.manual_seed(2)
    base = cp.asarray(np.random.default_rng(3).standard_normal(20011).astype(np.float32) * 300)
    for dtype in ("fp16", "bf16"):
        for n in (1, 3, 4, 5, 2047, 2048, 2049, 4096, 4099, 3 * 4096 + 7, 1_000_003):
            src = torch.randn(n, device="cuda") * 300
            src[0] = float("nan")
            for source in (src, base[1:1 + min(n, 20000)]):  # torch; a view 4 bytes off
                m = int(np.prod(source.shape))
                guard = 0x3C00 if dtype == "fp16" else 0x5555  # fp16 1.0; a bf16 pattern
                buf = cp.full(m + 8, guard, dtype=np.uint16).view(np.float16 if dtype == "fp16" else np.uint16)
                sync.copy_many([(buf[:m], source)], dtype, kernel=kernel)  # one pair: one range
                cp.cuda.runtime.deviceSynchronize()
                host = source.cpu().numpy() if isinstance(source, torch.Tensor) else cp.asnumpy(source)
                got = cp.asnumpy(buf).view(np.uint16)
                if dtype == "fp16":
                    with np.errstate(over="ignore"):
                        want = host.astype(np.float16).view(np.uint16)
                else:
                    want = fp32_to_bf16_bits(host)
                ok = ~np.isnan(host)
                np.testing.assert_array_equal(got[:m][ok], want[ok], err_msg=f"{dtype} n {m} loads {loads}")
                assert np.all(got[m:] == guard), f"{dtype} n {m} loads {loads}: written past the end"


# ------------------------------------------------------------------ engine vs trainer


# init -> bound on mean |dlogp|. The gap is the engine's fp16 activations (the contract: stored
# in the engine dtype where the kernels store them); the trainer keeps fp32 activations. On
# CPU, the NumPy reference engine against the trainer on these shapes (40 tokens a seed):
#   "hf"     transformers' Qwen2 init, N(0, 0.02), unit norms, zero biases, near-uniform
#            outputs (mean logp -11.7): 0.88e-3, 1.13e-3, 1.13e-3 for three seeds; the same
#            engine with fp32 activations (fp16 weights): 1.2e-6.
#   "spread" embeddings N(0, 0.1), logits spread over a few nats (mean logp -7.4): 5.7e-3
#            (the GPU measured 5.6e-3 over 16,384 tokens).
# So 1e-3 cannot hold for fp16 activations on a 24-layer model; the bounds leave ~40% margin.
# An fp32 engine (fp32 weights and activations) against the trainer on the same fp32 weights
# differs only by summation order: the bound, 1e-4.
# A trainer that also rounds its fp32 activations where the engine stores them (storage_dtype,
# ratchet/trainer/precision.py) is no closer here: "hf" measured 1.15e-3 on the H200 against
# 1.03e-3 without (two roundings of values that differ in their fp32 summation order part
# ways at the first one that flips). The engine's own arithmetic (teacher forcing through its
# kernels, ratchet/engine/score.py) is what matches: test_batch_invariant_engine_replays_...
DLOGP_BOUND = {("fp16", "hf"): 1.5e-3, ("fp16", "spread"): 1e-2, ("fp32", "hf"): 1e-4, ("fp32", "spread"): 1e-4}
# Coder-1.5B's shapes (hidden 1536, head_dim 128, 28 layers, untied head): the fp16 engine's
# activations leave a larger gap than at 0.5B, 2.35e-3 on the H200 (16,384 tokens, "hf"),
# while the fp32 engine agrees with the trainer to 6.0e-6 (the kernels are right at these
# shapes). The bound keeps ~50% margin over the measurement, as at 0.5B.
DLOGP_BOUND_15B = {("fp16", "hf"): 3.5e-3, ("fp32", "hf"): 1e-4}


@pytest.mark.parametrize("shape,dtype,init", [("qwen2.5-0.5b", *k) for k in DLOGP_BOUND]
                         + [("qwen2.5-coder-1.5b", *k) for k in DLOGP_BOUND_15B])
def test_engine_vs_trainer_real_shapes(shape, dtype, init):
    """>= 16,000 tokens sampled by the engine (fp16, or fp32) scored by the trainer on the
    engine's weights (fp16-rounded, or fp32; fp32 compute): mean |logp_engine - logp_trainer|
    under DLOGP_BOUND (DLOGP_BOUND_15B at the 1.5B shapes: head_dim 128, 6 query heads a kv
    head, untied head, 28 layers)."""
    import torch

    from ratchet.bench.workload import SHAPES
    from ratchet.engine.cuda.backend import CudaBackend
    from ratchet.trainer.policy import Policy

    cfg = SHAPES[shape]()
    torch.manual_seed(0)
    with torch.device("cuda"):
        policy = Policy(cfg)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
                if init == "spread":
                    p.add_(0.05 * torch.randn_like(p))
            elif name.endswith("bias"):
                if init == "spread":
                    p.normal_(0, 0.05)
                else:
                    p.zero_()
            else:
                p.normal_(0, 0.1 if (init == "spread" and name == "embed.weight") else 0.02)
    batch, prompt_len, new = 64, 128, 256
    engine = CudaBackend(cfg, dtype, batch, prompt_len + new)
    engine.load_weights(policy.export_weights())  # in-place sync path, rounded on the GPU
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, cfg.vocab_size, prompt_len).tolist() for _ in range(batch)]
    slots = list(range(batch))
    first = engine.prefill_batch(slots, prompts, device=True)
    tokens, logprobs = engine.sample(first, SamplingBatch([0] * batch, slots, [0] * batch, [1.0] * batch,
                                                          [False] * batch))
    responses = [[int(t)] for t in tokens]
    engine_lp = [[float(x)] for x in logprobs]
    for step in range(1, new):
        tokens, logprobs = engine.decode_sample(slots, [r[-1] for r in responses], [prompt_len + step - 1] * batch,
                                                SamplingBatch([0] * batch, slots, [step] * batch, [1.0] * batch,
                                                              [False] * batch))
        for r, lp, t, x in zip(responses, engine_lp, tokens, logprobs):
            r.append(int(t))
            lp.append(float(x))
    del engine
    with torch.no_grad():
        trainer_lp = []
        for i in range(0, batch, 16):
            lp, mask, _ = policy.token_logprobs(prompts[i:i + 16], responses[i:i + 16], weight_dtype=dtype,
                                                compute_dtype="fp32")
            trainer_lp.append(lp[mask].cpu().numpy())
    trainer_lp = np.concatenate(trainer_lp)
    engine_flat = np.concatenate([np.asarray(x, np.float32) for x in engine_lp])
    d = np.abs(engine_flat - trainer_lp)
    print(f"\nengine {dtype} vs trainer ({dtype} weights, fp32 compute), init {init}: {d.size} tokens, "
          f"mean |dlogp| {d.mean():.3g}, max {d.max():.3g}, mean logp {engine_flat.mean():.3f}")
    assert d.size >= 16000
    assert d.mean() <= (DLOGP_BOUND_15B if shape == "qwen2.5-coder-1.5b" else DLOGP_BOUND)[dtype, init]


# ------------------------------------------------------------------ sync telemetry, one kernel


class _Masters:
    """The Policy surface SyncTelemetry reads: fp32 CUDA tensors by name."""

    def __init__(self, weights):
        self.weights = weights

    def export_weights(self):
        return self.weights


def _telemetry_masters(dtype: str, seed: int):
    """Sizes around a chunk (8,192) and a checksum block (65,536), values on and off the
    dtype's grid, signed zeros and exact ties between two grid values."""
    import torch

    from ratchet.trainer.precision import torch_dtype

    g = torch.Generator(device="cuda").manual_seed(seed)
    sizes = {"a": 1, "b": 8191, "c": 8193, "d": 2 * 65536 + 5, "e": 300_000}
    out = {}
    for name, n in sizes.items():
        w = torch.randn(n, generator=g, device="cuda") * 0.05
        on_grid = w[: n // 3].to(torch_dtype(dtype)).float()
        w[: n // 3] = on_grid
        if n > 10:
            w[3], w[4] = 0.0, -0.0
            spacing = 2.0 ** -10 if dtype == "fp16" else 2.0 ** -7
            w[5] = 1.0 + spacing / 2  # a tie: rounds to even
        out[name] = w
    return out


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("held", [False, True], ids=["from-masters", "held-given"])
def test_one_kernel_telemetry_equals_torchs(dtype, held):
    """The fused path's shares and checksums are torch's, bit for bit, over updates of which
    some the rounding hides and some it shows; with the engine's start values given (a resumed
    engine) and without."""
    import torch

    from ratchet.rl.telemetry import SyncTelemetry
    from ratchet.trainer.precision import torch_dtype

    masters = _Masters(_telemetry_masters(dtype, seed=1))
    start = ({k: (v * 0.999).to("cpu", torch_dtype(dtype)) for k, v in masters.weights.items()}
             if held else None)
    fused = SyncTelemetry(masters, dtype, held=start, fused=True)
    plain = SyncTelemetry(masters, dtype, held=start, fused=False)
    assert fused.fused is not None and plain.fused is None
    for step, scale in enumerate((1.0, 1 + 1e-6, 1 + 1e-3, 1.0)):
        with torch.no_grad():
            for w in masters.weights.values():
                w.mul_(scale)
        (fs, fc), (ts, tc) = fused.measure(masters), plain.measure(masters)
        assert fc == tc, step
        for key in ("sync/visible_share", "sync/masters_off_grid_share"):
            assert fs[key] == ts[key], (step, key)
    assert 0 < fs["sync/masters_off_grid_share"] < 1


def test_one_kernel_parity_catches_a_stale_engine_value():
    """After an in-place sync the trainer's expected checksums (one kernel) and the engine's
    (one kernel) agree; one engine weight left stale breaks parity and names its tensor."""
    import cupy as cp
    import torch

    from ratchet.engine.cuda.backend import CudaBackend
    from ratchet.rl.telemetry import SyncTelemetry, parity

    cfg = small_config("a")
    masters = _Masters({k: torch.from_numpy(v).cuda() for k, v in random_weights(cfg, seed=7).items()})
    engine = CudaBackend(cfg, "fp16", 4, 64)
    engine.load_weights({k: round_to(v.cpu().numpy(), "fp16") for k, v in masters.weights.items()})
    telemetry = SyncTelemetry(masters, "fp16", fused=True)
    with torch.no_grad():
        for w in masters.weights.values():
            w.mul_(1 + 1e-2)
    _, expected = telemetry.measure(masters)
    engine.update_weights(masters.weights)
    assert parity(expected, engine.weight_checksums()) == (1.0, None)
    name = list(engine.weights)[3]
    flat = engine.weights[name].reshape(-1)
    flat[7] = cp.asarray(flat[7].get() + 1)  # one stale value
    assert parity(expected, engine.weight_checksums()) == (0.0, name)
