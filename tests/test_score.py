"""Teacher forcing through the engine (`Engine.score`) and the sampler's `forced`
rows: scoring sampled answers with the engine's own arithmetic gives the rollout's bits."""

from __future__ import annotations

import numpy as np
import pytest

from ratchet.engine.engine import Engine
from ratchet.engine.request import Request
from ratchet.engine.sampler import sample
from ratchet.engine.sampling import SamplingBatch
from ratchet.gap import gap_metrics
from test_engine import tiny_model


def max_gap(engine_logprobs: list[list[float]], forced: list[list[float]]) -> float:
    """max |engine - forced| over every token (ratchet's gap metric)."""
    flat = [np.concatenate([np.asarray(x, np.float64) for x in lps]) for lps in (engine_logprobs, forced)]
    return gap_metrics(*flat, prefix="")["logprob_abs_diff_max"]


def test_forced_rows_take_the_token_with_the_drawn_logprob():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(5, 64)).astype(np.float32) * 3
    args = ([1] * 5, list(range(5)), [7] * 5, [0.7] * 5, [False, False, True, False, True])
    drawn, drawn_lp = sample(logits, SamplingBatch(*args))
    other = (drawn + 1) % 64
    forced = np.where(np.arange(5) % 2 == 0, other, -1)
    tokens, lp = sample(logits, SamplingBatch(*args, forced=forced))
    np.testing.assert_array_equal(tokens, np.where(forced >= 0, forced, drawn))
    np.testing.assert_array_equal(lp[forced < 0], drawn_lp[forced < 0])
    # a forced row's logprob is the drawn arithmetic on the forced token
    again, again_lp = sample(logits, SamplingBatch(*args, forced=drawn))
    np.testing.assert_array_equal(again, drawn)
    np.testing.assert_array_equal(again_lp, drawn_lp)
    assert not np.array_equal(lp[forced >= 0], drawn_lp[forced >= 0])
    with pytest.raises(ValueError, match="forced token 64"):
        sample(logits, SamplingBatch(*args, forced=[64, -1, -1, -1, -1]))


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_teacher_forcing_gives_the_rollouts_bits_in_other_groupings(dtype):
    model = tiny_model(seed=3, dtype=dtype)
    engine = Engine(model, max_batch_size=8, max_seq_len=64)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 64, rng.integers(3, 12)).tolist() for _ in range(7)]
    reqs = engine.generate([Request(i, p, max_new_tokens=int(rng.integers(1, 20)), temperature=0.9, seed=5)
                            for i, p in enumerate(prompts)])
    answers = [r.output for r in reqs]
    sampled = [r.logprobs for r in reqs]
    for size in (1, 3, 8):  # groupings other than the rollout's (all seven at once, shrinking)
        lps = engine.score(prompts, answers, temperature=0.9, batch_size=size)
        assert [len(x) for x in lps] == [len(a) for a in answers]
        assert max_gap(sampled, lps) == 0.0, size
    # the engine is usable afterwards, and scoring at another temperature differs
    other = engine.score(prompts, answers, temperature=1.3)
    assert max_gap(sampled, other) > 1e-3
    again = engine.generate([Request(100 + i, p, max_new_tokens=len(a), temperature=0.9, seed=5)
                             for i, (p, a) in enumerate(zip(prompts, answers))])
    assert all(len(r.output) == len(a) for r, a in zip(again, answers))


def test_teacher_forcing_checks_its_inputs():
    model = tiny_model(seed=3)
    engine = Engine(model, max_batch_size=4, max_seq_len=16)
    with pytest.raises(ValueError, match="2 prompts for 1 answers"):
        engine.score([[1], [2]], [[3]])
    with pytest.raises(ValueError, match="past the engine's max_seq_len 16"):
        engine.score([[1] * 10], [[3] * 7])
    assert engine.score([[1], [2]], [[], [5]])[0] == []
    # -1 would be read as "draw" in an answer and wrap to the last token in a prompt
    with pytest.raises(ValueError, match="answer 1 has token id -1, outside the vocabulary"):
        engine.score([[1], [2]], [[3], [4, -1]])
    with pytest.raises(ValueError, match="prompt 0 has token id -1"):
        engine.score([[-1, 2]], [[3]])
    with pytest.raises(ValueError, match="answer 0 has token id 64"):
        engine.score([[1]], [[64]])
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        engine.score([[1], []], [[3], [4]])
    for size in (0, -1):  # -1 scored nothing at all, silently
        with pytest.raises(ValueError, match=f"batch_size must be >= 1.*got {size}"):
            engine.score([[1]], [[3]], batch_size=size)
    engine.add(Request(0, [1, 2], max_new_tokens=3))
    with pytest.raises(RuntimeError, match="1 requests are running or waiting"):
        engine.score([[1]], [[3]])
