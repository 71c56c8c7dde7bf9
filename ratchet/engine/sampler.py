"""Token sampling: Gumbel-max over logits / T with counter-based noise, and the token's logprob.

    z      = logits / T                                  float32 division, T as float32
                                                         (T = 1 when greedy with temperature 0)
    g      = float32(-log(-log(u)))                      evaluated in float64, u from
                                                         rng.uniforms_batch
    token  = argmax(z + g)            (sampled)          first index on ties
             argmax(logits)           (greedy)
             forced[b]                (teacher forcing: where forced[b] >= 0)
    logprob = (z[token] - max z) - log(sum(exp(z - max z)))

Gumbel-max draws exactly from softmax(z) without sorting the vocabulary or a cumulative sum,
and every row only reads its own logits and its own (seed, request_id, token_index) noise,
so a token never depends on the rest of the batch.

Teacher forcing (`forced`): a row given a token takes it instead of drawing one, and gets its
log-probability by the same arithmetic as a drawn token: scoring a sampled answer token by
token this way gives the very bits the sampler returned when it drew it (ratchet/engine/score.py).

Precision of the logprob: exp(z - max z) is evaluated in float32, its sum is accumulated in
float64 (vocabularies of 150k terms lose digits in a float32 sum), and the final
subtraction is done in float64 and rounded once to float32.
"""

from __future__ import annotations

import numpy as np

from ratchet.engine.rng import uniforms_batch
from ratchet.engine.sampling import SamplingBatch


def gumbel_noise(u: np.ndarray) -> np.ndarray:
    """Gumbel noise in float32, computed in float64 and rounded once.

    NumPy's float32 log is not correctly rounded and its last bit depends on the CPU's vector
    instructions; in float64 the error sits far below float32's rounding step, so the rounded
    noise is the same on every machine (and the CUDA sampler's table of it is too)."""
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
