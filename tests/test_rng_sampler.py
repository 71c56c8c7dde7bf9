"""Philox-4x32-10 against Random123's known answers, and the Gumbel-max sampler."""

from __future__ import annotations

import numpy as np
import pytest

from ratchet.engine.rng import philox4x32, uniforms, uniforms_batch
from ratchet.engine.sampler import sample
from ratchet.engine.sampling import SamplingBatch

M32 = 0xFFFFFFFF

# Random123 kat_vectors: philox4x32 10 rounds, (counter, key) -> output
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((M32,) * 4, (M32,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def philox_python(counter, key, rounds=10):
    """Philox-4x32 on Python ints, written from the paper: the plain reference."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + 0x9E3779B9) & M32, (k1 + 0xBB67AE85) & M32
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & M32, (p0 >> 32) ^ c3 ^ k1, p0 & M32
    return c0, c1, c2, c3


@pytest.mark.parametrize("counter,key,expected", KNOWN_ANSWERS)
def test_philox_known_answers(counter, key, expected):
    assert tuple(int(x) for x in philox4x32(counter, key)) == expected
    assert philox_python(counter, key) == expected


def test_philox_vectorised_matches_python():
    rng = np.random.default_rng(0)
    words = rng.integers(0, 2**32, size=(6, 200), dtype=np.uint64)
    out = philox4x32(words[:4], words[4:])
    for i in range(200):
        column = [int(w) for w in words[:, i]]
        want = philox_python(tuple(column[:4]), tuple(column[4:]))
        assert tuple(int(o[i]) for o in out) == want


def test_uniforms_recipe_range_and_grid():
    u = uniforms(seed=7, request_id=3, token_index=5, n_vocab=4096)
    assert u.dtype == np.float32 and u.shape == (4096,)
    x0 = philox4x32((5, np.arange(4096), 0, 0), (7, 3))[0]
    np.testing.assert_array_equal(u, ((x0 >> 9).astype(np.float32) + 0.5) * np.float32(2**-23))
    assert u.min() > 0 and u.max() < 1
    odd = u.astype(np.float64) * 2**24  # every value is (2m + 1) * 2**-24 exactly
    assert np.all(odd == np.round(odd)) and np.all(odd % 2 == 1)
    # the extremes of the recipe are representable and stay inside (0, 1)
    ends = ((np.array([0, M32], np.uint32) >> 9).astype(np.float32) + 0.5) * np.float32(2**-23)
    assert 0 < ends[0] and ends[1] < 1 and np.isfinite(-np.log(-np.log(ends))).all()


def test_uniforms_keys_and_counters_change_the_stream():
    base = uniforms(1, 2, 3, 64)
    np.testing.assert_array_equal(base, uniforms(1, 2, 3, 64))
    for other in (uniforms(2, 2, 3, 64), uniforms(1, 3, 3, 64), uniforms(1, 2, 4, 64)):
        assert not np.any(other == base) or np.mean(other == base) < 0.05
    np.testing.assert_array_equal(uniforms(1, 2, 3, 100)[:64], base)  # vocab prefix is stable
    np.testing.assert_array_equal(uniforms(1 + 2**32, 2, 3, 64), base)  # seed modulo 2**32
    batch = uniforms_batch([1, 9], [2, 2], [3, 0], 64)
    np.testing.assert_array_equal(batch[0], base)


def log_softmax64(z):
    z = np.asarray(z, dtype=np.float64)
    m = z.max(-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(-1, keepdims=True))


def test_sampled_distribution_matches_softmax():
    rng = np.random.default_rng(1)
    vocab, n, temperature = 12, 20000, 0.7
    logits = rng.normal(0, 1.5, size=vocab).astype(np.float32)
    tokens, logprobs = sample(np.tile(logits, (n, 1)), SamplingBatch(
        seeds=np.full(n, 5), request_ids=np.full(n, 11), token_indices=np.arange(n),
        temperatures=np.full(n, temperature), greedy=np.zeros(n, bool)))
    z = logits / np.float32(temperature)
    probs = np.exp(log_softmax64(z))
    counts = np.bincount(tokens, minlength=vocab)
    chi2 = float(((counts - n * probs) ** 2 / (n * probs)).sum())
    print(f"chi-square {chi2:.2f} on {vocab - 1} degrees of freedom")
    assert chi2 < 35.0  # p ~ 2e-4 for 11 dof; the fixed seed makes this deterministic
    np.testing.assert_allclose(logprobs, log_softmax64(z)[tokens], atol=1e-6, rtol=0)


def test_greedy_is_argmax_and_logprob_at_temperature():
    rng = np.random.default_rng(2)
    logits = rng.normal(0, 3, size=(6, 50)).astype(np.float32)
    logits[0, [3, 17]] = logits[0].max() + 1  # a tie: the first index wins
    temps = np.array([0, 0, 1, 2, 0.5, 0], np.float32)
    tokens, logprobs = sample(logits, SamplingBatch(seeds=np.arange(6), request_ids=np.arange(6),
                                                    token_indices=np.zeros(6), temperatures=temps,
                                                    greedy=np.ones(6, bool)))
    np.testing.assert_array_equal(tokens, np.argmax(logits, -1))
    assert tokens[0] == 3 and tokens.dtype == np.int64 and logprobs.dtype == np.float32
    t_eff = np.where(temps == 0, 1, temps).astype(np.float32)
    z = logits / t_eff[:, None]
    np.testing.assert_allclose(logprobs, log_softmax64(z)[np.arange(6), tokens], atol=1e-6, rtol=0)


def test_logprob_matches_float64_log_softmax_on_a_large_vocabulary():
    rng = np.random.default_rng(3)
    logits = rng.normal(0, 4, size=(4, 50000)).astype(np.float32)
    temps = np.array([1.0, 0.6, 1.3, 1.0], np.float32)
    tokens, logprobs = sample(logits, SamplingBatch(seeds=[1, 2, 3, 4], request_ids=[0, 0, 0, 0],
                                                    token_indices=[0, 0, 0, 0], temperatures=temps,
                                                    greedy=[0, 0, 0, 1]))
    z = logits / temps[:, None]
    ref = log_softmax64(z)[np.arange(4), tokens]
    print("logprob max abs diff vs float64:", np.abs(logprobs - ref).max())
    np.testing.assert_allclose(logprobs, ref, atol=1e-6, rtol=0)


def test_tokens_do_not_depend_on_the_batch():
    rng = np.random.default_rng(4)
    logits = rng.normal(0, 2, size=(7, 300)).astype(np.float32)
    params = dict(seeds=np.array([3, 3, 9, 1, 0, 5, 2]),
                  request_ids=np.array([0, 1, 2, 3, 4, 5, 6]),
                  token_indices=np.array([0, 4, 8, 1, 2, 3, 5]),
                  temperatures=np.array([1, 0.8, 1.2, 1, 0.3, 1, 2], np.float32),
                  greedy=np.array([0, 0, 0, 1, 0, 0, 0], bool))
    tokens, logprobs = sample(logits, SamplingBatch(**params))
    for order in ([6, 0, 2], [3], [5, 4, 1, 0, 2, 3, 6]):
        sub = SamplingBatch(**{k: v[order] for k, v in params.items()})
        t, lp = sample(logits[order], sub)
        np.testing.assert_array_equal(t, tokens[order])
        np.testing.assert_array_equal(lp, logprobs[order])


def test_sample_rejects_nonpositive_temperature():
    with pytest.raises(ValueError, match="temperature"):
        sample(np.zeros((1, 4), np.float32), SamplingBatch([0], [0], [0], [0.0], [False]))


@pytest.mark.parametrize("temps,greedy,ok", [
    ([1.0, 0.0], [False, True], True),        # T = 0 is fine on a greedy row
    ([1.0, 0.0], [False, False], False),
    ([1.0, -1.0], [False, False], False),
    ([float("nan"), 1.0], [False, False], False),  # NaN is no temperature
    ([float("nan"), 1.0], [True, False], True),
])
def test_sampling_batch_checks_only_the_rows_that_sample(temps, greedy, ok):
    if ok:
        batch = SamplingBatch([0, 0], [0, 1], [0, 0], temps, greedy)
        t, g = batch.temperatures, batch.greedy
        assert t.dtype == np.float32 and g.dtype == bool
    else:
        with pytest.raises(ValueError, match="temperature must be > 0"):
            SamplingBatch([0, 0], [0, 1], [0, 0], temps, greedy)


def test_sampling_batch_normalises_and_checks_its_rows():
    batch = SamplingBatch([2**32 + 5, -1], [7, 8], [0.0, 3.0], [1, 0.5], [0, 1], forced=[-1, -1])
    assert batch.seeds.dtype == np.int64 and batch.token_indices.tolist() == [0, 3]
    assert batch.forced is None  # no row forced: the samplers skip the forcing
    with pytest.raises(ValueError):
        SamplingBatch([0, 0], [0], [0, 0], [1.0, 1.0], [False, False])  # a field of another length
    with pytest.raises(ValueError, match="below -1"):
        SamplingBatch([0], [0], [0], [1.0], [False], forced=[-2])
    with pytest.raises(ValueError, match="2 rows for 3 rows of logits"):
        sample(np.zeros((3, 4), np.float32), SamplingBatch([0, 0], [0, 1], [0, 0], [1.0, 1.0], [False, False]))
    # the key words wrap modulo 2**32 as the RNG takes them: seed 2**32 + 5 draws as seed 5
    logits = np.zeros((1, 64), np.float32)
    wrapped = sample(logits, SamplingBatch([2**32 + 5], [7], [0], [1.0], [False]))
    np.testing.assert_array_equal(wrapped[0], sample(logits, SamplingBatch([5], [7], [0], [1.0], [False]))[0])
