"""Token sampling: Gumbel-max over logits / T with counter-based noise, which draws exactly
from softmax(z) without a sort, each row reading only its own logits and noise, so a token
never depends on the batch. The recipe (the CUDA sampler's too):

    z       = logits / T                     float32; T = 1 where greedy with T = 0
    g       = float32(-log(-log(u)))         in float64, u from rng.uniforms_batch
    token   = argmax(z + g)                  sampled (first index on ties)
              argmax(logits)                 greedy
              forced[b]                      teacher forcing, where forced[b] >= 0
    logprob = (z[token] - max z) - log(sum(exp(z - max z)))   exp in float32, sum in float64
"""

from __future__ import annotations

import numpy as np

from ratchet.engine.rng import uniforms_batch
from ratchet.engine.sampling import SamplingBatch


def gumbel_noise(u: np.ndarray) -> np.ndarray:
    """Gumbel noise computed in float64 and rounded once to float32: NumPy's float32 log is
    not correctly rounded (its last bit follows the CPU's vector instructions), so this makes
    the noise, and the CUDA sampler's table of it, the same on every machine."""
    u = np.asarray(u, dtype=np.float64)
    return (-np.log(-np.log(u))).astype(np.float32)


def scaled_logits(logits: np.ndarray, temperatures: np.ndarray, greedy: np.ndarray) -> np.ndarray:
    """z = logits / T in float32, T = 1 for greedy rows whose temperature is 0."""
    t = np.where(greedy & (temperatures == 0), 1.0, temperatures).astype(np.float32)
    return logits / t[:, None]


def token_logprobs(z: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """log_softmax(z)[b, tokens[b]] for each row, max-subtracted; float32 [B]."""
    z_max = z.max(axis=-1, keepdims=True)  # [B, 1]
    sum_exp = np.exp(z - z_max).astype(np.float64).sum(axis=-1)  # [B]
    picked = np.take_along_axis(z, tokens[:, None], axis=-1)[:, 0]
    shifted = picked.astype(np.float64) - z_max[:, 0].astype(np.float64)
    return (shifted - np.log(sum_exp)).astype(np.float32)


def sample(logits: np.ndarray, batch: SamplingBatch) -> tuple[np.ndarray, np.ndarray]:
    """One token per row of `logits` [B, V] -> (tokens int64 [B], logprobs float32 [B])."""
    logits = np.asarray(logits, dtype=np.float32)
    rows, vocab = logits.shape
    batch.check(rows, vocab)
    greedy, forced = batch.greedy, batch.forced
    z = scaled_logits(logits, batch.temperatures, greedy)  # [B, V]
    tokens = np.argmax(logits, axis=-1)
    drawn = ~greedy if forced is None else ~greedy & (forced < 0)
    if drawn.any():  # the noise costs B*V Philox calls: only the rows that sample pay it
        picked = np.flatnonzero(drawn)
        u = uniforms_batch(batch.seeds[picked], batch.request_ids[picked], batch.token_indices[picked],
                           vocab)  # [b, V]
        tokens[picked] = np.argmax(z[picked] + gumbel_noise(u), axis=-1)
    tokens = tokens.astype(np.int64)
    if forced is not None:
        tokens = np.where(forced >= 0, forced, tokens)
    return tokens, token_logprobs(z, tokens)
