"""Philox-4x32-10, the counter-based RNG behind every sampled token, in vectorised NumPy: the
bits for (key, counter) are a pure function of both, so a token's randomness never depends on
its batch, the schedule, or a cancel and resume. The recipe (the CUDA sampler's too):

    key     = (seed mod 2**32, request_id mod 2**32)
    counter = (token_index, vocab_index, 0, 0)
    x0, ... = philox4x32_10(counter, key)                 Random123's Philox4x32-10
    u       = (float32(x0 >> 9) + 0.5f) * 2**-23          (2m + 1) 2**-24: never 0 nor 1
                                                          (24 bits would round the top one to 1.0)
"""

from __future__ import annotations

import numpy as np

PHILOX_M0 = np.uint64(0xD2511F53)
PHILOX_M1 = np.uint64(0xCD9E8D57)
PHILOX_W0 = np.uint32(0x9E3779B9)
PHILOX_W1 = np.uint32(0xBB67AE85)
PHILOX_ROUNDS = 10
UNIFORM_BITS = 23


def as_uint32(x) -> np.ndarray:
    """Any integers (Python ints, int64 arrays, negatives) reduced modulo 2**32 to uint32."""
    return (np.asarray(x, dtype=np.int64) & 0xFFFFFFFF).astype(np.uint32)


def _mulhilo(m: np.uint64, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    product = c.astype(np.uint64)
    product *= m  # exact: a 32x32-bit product fits in 64 bits
    return (product >> np.uint64(32)).astype(np.uint32), product.astype(np.uint32)


def philox4x32(counter, key, rounds: int = PHILOX_ROUNDS) -> tuple[np.ndarray, ...]:
    """Philox-4x32 of four uint32 counter words and two key words (any broadcastable shapes).

    Returns four uint32 arrays of the broadcast shape. Words stay at their own shapes while
    they can (a [B, 1] counter against a [1, V] one): the first rounds then cost ~nothing.
    """
    words = [as_uint32(w) for w in (*counter, *key)]
    shape = np.broadcast_shapes(*(w.shape for w in words))
    c0, c1, c2, c3, k0, k1 = (np.atleast_1d(w) for w in words)  # 1-d: no scalar overflow warnings
    with np.errstate(over="ignore"):  # uint32 key additions wrap by design
        for r in range(rounds):
            if r:
                k0, k1 = k0 + PHILOX_W0, k1 + PHILOX_W1
            hi0, lo0 = _mulhilo(PHILOX_M0, c0)
            hi1, lo1 = _mulhilo(PHILOX_M1, c2)
            c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return tuple(np.array(np.broadcast_to(c, shape) if shape else c.reshape(shape))
                 for c in (c0, c1, c2, c3))


def bits_to_uniform(x: np.ndarray) -> np.ndarray:
    """uint32 -> float32 in (0, 1): (float32(x >> 9) + 0.5) * 2**-23, exact."""
    top = (x >> np.uint32(32 - UNIFORM_BITS)).astype(np.float32)
    return (top + np.float32(0.5)) * np.float32(2.0 ** -UNIFORM_BITS)


def uniforms_batch(seeds, request_ids, token_indices, n_vocab: int) -> np.ndarray:
    """float32 [B, n_vocab]: row b keyed by (seeds[b], request_ids[b]) at token_indices[b]."""
    seeds, request_ids, token_indices = (as_uint32(x)[:, None]
                                         for x in (seeds, request_ids, token_indices))
    vocab_index = np.arange(n_vocab, dtype=np.uint32)[None, :]
    x0, _, _, _ = philox4x32((token_indices, vocab_index, 0, 0), (seeds, request_ids))
    return bits_to_uniform(x0)


def uniforms(seed: int, request_id: int, token_index: int, n_vocab: int) -> np.ndarray:
    """float32 [n_vocab] in (0, 1): the uniforms for one token of one request."""
    return uniforms_batch([seed], [request_id], [token_index], n_vocab)[0]
