"""The model's operations in float32 NumPy, each with a fixed summation order per row, so a
row's result is bit-identical whatever else is in the batch (BLAS gemm picks its kernels,
and so its sums, by the number of rows): one gemv a row in `linear`, NumPy's pairwise sum
over a contiguous last axis, attention over fixed key blocks added in order."""

from __future__ import annotations

import numpy as np

KEY_BLOCK = 64  # keys per attention block; the KV cache length is a multiple of it


def linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """x [R, K] @ weight[N, K].T (+ bias) -> float32 [R, N], one gemv per row."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    w = weight.astype(np.float32, copy=False)  # fp16 storage is widened for the product only
    y = np.matmul(x[:, None, :], w.T)[:, 0]  # [R, N]
    return y if bias is None else y + bias.astype(np.float32, copy=False)


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """HF Qwen2/Llama RMSNorm: x * rsqrt(mean(x^2) + eps) * w, in float32."""
    mean_square = np.mean(np.square(x), axis=-1, keepdims=True)  # [R, 1]
    inv_rms = np.float32(1.0) / np.sqrt(mean_square + np.float32(eps))
    return (x * inv_rms) * weight.astype(np.float32, copy=False)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate-half RoPE. x [R, heads, hd]; cos, sin [R, hd/2] (the rows' positions)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = cos[:, None, :], sin[:, None, :]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def silu_mul(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """SwiGLU: silu(gate) * up = gate / (1 + exp(-gate)) * up, in float32."""
    with np.errstate(over="ignore"):  # exp(-gate) = inf for gate < -88 gives silu = -0, right
        return gate / (np.float32(1.0) + np.exp(-gate)) * up


def attention(q: np.ndarray, keys: np.ndarray, values: np.ndarray,
              positions: np.ndarray) -> np.ndarray:
    """Causal GQA attention of query rows over cached keys.

    q [R, H, hd] float32; keys, values [R or 1, K, n, hd] (the rows' cache, n a multiple of
    KEY_BLOCK, any float dtype); positions [R]: row r attends to keys 0 .. positions[r].
    Returns float32 [R, H, hd]. Softmax in float32 with scores scaled by 1/sqrt(hd).
    """
    rows, num_heads, head_dim = q.shape
    num_kv_heads, n = keys.shape[1], keys.shape[2]
    group = num_heads // num_kv_heads
    scale = np.float32(1.0 / np.sqrt(head_dim))
    q = q.reshape(rows, num_kv_heads, group, 1, head_dim)  # query head h uses kv head h // group
    blocks = [slice(s, s + KEY_BLOCK) for s in range(0, n, KEY_BLOCK)]

    scores = np.empty((rows, num_kv_heads, group, n), dtype=np.float32)
    for blk in blocks:
        k = keys[:, :, None, blk, :]  # [R|1, K, 1, KB, hd]
        scores[..., blk] = np.multiply(q, k, order="C", dtype=np.float32).sum(-1) * scale
    visible = np.arange(n)[None, :] <= positions[:, None]  # [R, n]
    scores = np.where(visible[:, None, None, :], scores, np.float32(-np.inf))
    probs = np.exp(scores - scores.max(axis=-1, keepdims=True))  # [R, K, G, n]; masked -> 0

    denom = np.zeros((rows, num_kv_heads, group), dtype=np.float32)
    out = np.zeros((rows, num_kv_heads, group, head_dim), dtype=np.float32)
    for blk in blocks:
        p = probs[..., blk]  # [R, K, G, KB]
        v_t = np.swapaxes(values[:, :, None, blk, :], -1, -2)  # [R|1, K, 1, hd, KB]
        denom = denom + p.sum(-1)
        out = out + np.multiply(p[..., None, :], v_t, order="C", dtype=np.float32).sum(-1)
    return (out / denom[..., None]).reshape(rows, num_heads, head_dim)
