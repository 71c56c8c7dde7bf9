"""Overlapped decode steps (`decode_sample_async` with `feed`, `Engine(overlap=True)`): tokens
fed from the previous step on the backend give the step-by-step engine's bits, through eos
stops, cancel and resume, and weight updates."""

from __future__ import annotations

import numpy as np
import pytest

from ratchet.engine.engine import Engine
from ratchet.engine.numpy.backend import NumpyBackend
from ratchet.engine.request import Request
from ratchet.engine.sampling import SamplingBatch
from random_model import random_weights
from test_engine import assert_same_generation, fresh, prompt, run_alone, tiny_model


def test_decode_feed_takes_the_previous_steps_tokens():
    model = tiny_model()
    backend = NumpyBackend(model.cfg, "fp16", max_batch_size=4, max_seq_len=128)
    backend.load_weights(model.weights)
    params = dict(seeds=[1, 2, 3], request_ids=[4, 5, 6], token_indices=[0, 0, 0],
                  temperatures=[1.0, 0.7, 1.0], greedy=[False, False, True])
    first_row = SamplingBatch(**{k: v[:1] for k, v in params.items()})
    with pytest.raises(ValueError, match="no sampling step has run"):
        backend.decode_sample_async([0], [1], [0], first_row, feed=[0])
    seqs = [prompt(70, 9), prompt(71, 4), prompt(72, 15)]
    for slot, toks in enumerate(seqs):
        backend.prefill(slot, toks[:-1], 0)
    first = backend.decode_sample_async([0, 1, 2], [t[-1] for t in seqs], [len(t) - 1 for t in seqs],
                                        SamplingBatch(**params))
    drawn = first.result()[0]
    # rows 2 and 0 go on, fed on the device; a new row (slot 3) brings its own token
    backend.prefill(3, [5, 6], 0)
    two = SamplingBatch(seeds=[3, 1, 9], request_ids=[6, 4, 7], token_indices=[1, 1, 0],
                        temperatures=[1.0, 1.0, 1.0], greedy=[True, False, False])
    positions = [len(seqs[2]), len(seqs[0]), 2]
    fed = backend.decode_sample_async([2, 0, 3], [-5, -5, 8], positions, two, feed=[2, 0, -1]).result()

    other = NumpyBackend(model.cfg, "fp16", max_batch_size=4, max_seq_len=128)
    other.load_weights(model.weights)
    for slot, toks in enumerate(seqs):
        other.prefill(slot, toks, 0)
    other.prefill(3, [5, 6], 0)
    want = other.decode_sample([2, 0, 3], [drawn[2], drawn[0], 8], positions, two)
    np.testing.assert_array_equal(fed[0], want[0])
    np.testing.assert_array_equal(fed[1], want[1])
    with pytest.raises(ValueError, match="feed row 3 is past the previous step's 3 rows"):
        backend.decode_sample_async([0], [1], [0], first_row, feed=[3])
    with pytest.raises(ValueError, match="feed has 2 rows, tokens 1"):
        backend.decode_sample_async([0], [1], [0], first_row, feed=[0, 1])


class CountingBackend:
    """Wraps a backend; counts the decode steps launched with rows fed from the one before."""

    def __init__(self, backend):
        self.inner, self.fed_steps, self.fed_rows = backend, 0, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def decode_sample_async(self, *args, feed=None, **kwargs):
        if feed is not None:
            self.fed_steps += 1
            self.fed_rows += sum(f >= 0 for f in feed)
        return self.inner.decode_sample_async(*args, feed=feed, **kwargs)


def mixed_workload(eos: int | None) -> list[Request]:
    """More requests than slots, eos and length stops, greedy and sampled rows."""
    return [Request(i, prompt(80 + i, 3 + 7 * i % 23), max_new_tokens=(5, 30, 12, 45, 2, 25, 60, 9)[i],
                    temperature=(1.0, 0.8, 1.3)[i % 3], greedy=i % 4 == 3, seed=i % 3)
            for i in range(8)]


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_overlapped_engine_equals_step_by_step(dtype):
    model = tiny_model(dtype=dtype)
    plain = Engine(model, max_batch_size=3, max_seq_len=64, overlap=False, eos_ids=[])
    outputs = [r.output for r in plain.generate(mixed_workload(None))]
    eos = np.bincount([t for o in outputs for t in o[1:]], minlength=64).argmax()  # stops several mid-way
    runs = {}
    for overlap in (False, True):
        engine = Engine(model, max_batch_size=3, max_seq_len=64, overlap=overlap, eos_ids=[int(eos)])
        engine.backend = CountingBackend(engine.backend)
        runs[overlap] = (engine.generate(mixed_workload(eos)), engine)
    got, want = runs[True][0], runs[False][0]
    assert sum(r.finish_reason == "eos" for r in want) >= 2, "the workload should stop on eos too"
    for g, w in zip(got, want):
        assert_same_generation(g, w)
    ahead, plain_engine = runs[True][1], runs[False][1]
    assert plain_engine.backend.fed_steps == 0
    # most steps ran ahead, each row fed from the step before on the backend
    assert ahead.backend.fed_steps > ahead.stats.num_decode_steps / 2
    assert ahead.stats.num_generated_tokens == plain_engine.stats.num_generated_tokens
    assert ahead._inflight is None


def test_overlapped_engine_cancel_resume_and_weights():
    model = tiny_model(tied=True)
    a = Request(5, prompt(20, 30), max_new_tokens=25, temperature=1.1, seed=9)
    whole = run_alone(model, a, overlap=False)
    engine = Engine(model, max_batch_size=3, max_seq_len=128)
    part = fresh(a)
    engine.add(part)
    engine.add(Request(1, prompt(21, 9), 40, seed=2))
    while len(part.output) < 7:
        engine.step()
    assert engine._inflight is not None, "the next step should be on its way"
    engine.cancel(5)  # its row in the launched step is dropped
    assert part.output == whole.output[:7]
    engine.step()
    assert part.output == whole.output[:7]
    engine.add(part)
    while part.finish_reason is None:
        engine.step()
    assert_same_generation(part, whole)
    engine.cancel_all()
    engine.update_weights(random_weights(model.cfg, seed=1))  # waits for a launched step first
    assert engine._inflight is None
