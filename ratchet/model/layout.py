"""The engine weight layout: the one set of names and shapes both engine and trainer use.

A weight sync is a copy because the trainer's parameters carry exactly these names and
shapes. Fusions: q, k and v projections are stacked into `wqkv` (q rows first, then k, then
v); gate and up projections into `w_gate_up` (gate rows first). With tied embeddings there is
no `lm_head.weight`: the head reuses `embed.weight`.
"""

from __future__ import annotations

import numpy as np

from ratchet.errors import InputError
from ratchet.model.config import ModelConfig

DTYPES = ("fp32", "fp16", "bf16")


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every engine tensor name and its shape, in a fixed order."""
    d, f, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    shapes: dict[str, tuple[int, ...]] = {"embed.weight": (v, d)}
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        shapes[p + "attn_norm.weight"] = (d,)
        shapes[p + "wqkv.weight"] = (cfg.qkv_size, d)
        if cfg.qkv_bias:
            shapes[p + "wqkv.bias"] = (cfg.qkv_size,)
        shapes[p + "wo.weight"] = (d, cfg.num_heads * cfg.head_dim)
        shapes[p + "mlp_norm.weight"] = (d,)
        shapes[p + "w_gate_up.weight"] = (2 * f, d)
        shapes[p + "w_down.weight"] = (d, f)
    shapes["norm.weight"] = (d,)
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (v, d)
    return shapes


FLAT_ALIGN = 64  # elements: each tensor of a flat buffer starts on a 128-byte line at 16 bits


def flat_offsets(cfg: ModelConfig) -> tuple[dict[str, tuple[int, int]], int]:
    """({name: (offset, size)}, length): every tensor in one flat buffer, in expected_shapes'
    order, each offset a multiple of FLAT_ALIGN. The trainer's CUDA masters and the CUDA
    engine's buffers share this layout, so a whole sync reads one range and writes one range
    (no gaps where every size is a multiple of FLAT_ALIGN, as in the Qwen2 models)."""
    out, offset = {}, 0
    for name, shape in expected_shapes(cfg).items():
        size = int(np.prod(shape))
        out[name] = (offset, size)
        offset += -(-size // FLAT_ALIGN) * FLAT_ALIGN
    return out, offset


def flat_views(cfg: ModelConfig, flat) -> dict:
    """{name: view of `flat`} in flat_offsets' layout, shaped as expected_shapes: one flat
    array (torch or CuPy, at least flat_offsets' length) seen as the named tensors."""
    offsets, _ = flat_offsets(cfg)
    return {name: flat[offset:offset + size].reshape(shape)
            for (name, shape), (offset, size) in zip(expected_shapes(cfg).items(), offsets.values())}


def coalesce(src_ptrs, dst_ptrs, sizes, itemsize: int) -> tuple[list[int], list[int], list[int]]:
    """Neighbours that continue each other on both sides (a source directly after the last
    source, its buffer directly after the last buffer) merged into one range: with the
    trainer's masters and the engine's buffers in one flat layout, a whole sync is one range.
    `itemsize`: bytes of a buffer element (sources are fp32)."""
    src, dst, n = [src_ptrs[0]], [dst_ptrs[0]], [sizes[0]]
    for s, d, k in zip(src_ptrs[1:], dst_ptrs[1:], sizes[1:]):
        if s == src[-1] + 4 * n[-1] and d == dst[-1] + itemsize * n[-1]:
            n[-1] += k
        else:
            src.append(s)
            dst.append(d)
            n.append(k)
    return src, dst, n


def num_parameters(cfg: ModelConfig) -> int:
    return sum(int(np.prod(s)) for s in expected_shapes(cfg).values())


def check_weights(cfg: ModelConfig, weights: dict, source: str) -> None:
    """Raise one clear error naming the first missing, unexpected or mis-shaped tensor."""
    want = expected_shapes(cfg)
    missing = [n for n in want if n not in weights]
    if missing:
        raise InputError(f"{source}: missing tensor {missing[0]!r}"
                         + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    extra = [n for n in weights if n not in want]
    if extra:
        raise InputError(f"{source}: unexpected tensor {extra[0]!r}")
    for name, shape in want.items():
        got = tuple(weights[name].shape)
        if got != shape:
            raise InputError(f"{source}: tensor {name!r} has shape {got}, expected {shape}")


def check_update(cfg: ModelConfig, weights: dict, source: str) -> None:
    """Like `check_weights` for an in-place update: any subset of the tensors, but each one a
    known name with its exact shape. Checks everything before the caller writes anything."""
    want = expected_shapes(cfg)
    for name, value in weights.items():
        if name not in want:
            raise InputError(f"{source}: unexpected tensor {name!r}")
        if tuple(value.shape) != want[name]:
            raise InputError(f"{source}: tensor {name!r} has shape {tuple(value.shape)}, "
                             f"expected {want[name]}")


def rope_inv_freq(cfg: ModelConfig) -> np.ndarray:
    """Inverse frequencies [head_dim/2] in float64, with Llama-3 scaling if configured.

    Computed once here so the engine and the trainer build identical cos/sin tables.
    """
    hd = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    rs = cfg.rope_scaling
    if rs is None:
        return inv
    factor = float(rs["factor"])
    low, high = float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
    old_len = float(rs["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * np.pi / inv
    scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled)


def rope_tables(cfg: ModelConfig, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin tables [max_len, head_dim/2] in float32 (HF's rotate-half convention)."""
    pos = np.arange(max_len, dtype=np.float64)[:, None]
    angles = pos * rope_inv_freq(cfg)[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
