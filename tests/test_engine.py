"""The engine on a tiny random model: against a plain forward, and its invariances.

The plain reference is a full-sequence float64 forward without a KV cache. Everything else
checks that batching, cancel/resume and prefill-vs-decode leave tokens and logprobs
bit-identical.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ratchet.engine.engine import Engine
from ratchet.engine.numpy.backend import NumpyBackend
from ratchet.engine.numpy.layers import KEY_BLOCK
from ratchet.engine.request import Request
from ratchet.engine.sampler import sample
from ratchet.engine.sampling import SamplingBatch
from ratchet.model.config import ModelConfig
from ratchet.model.dtypes import round_to
from ratchet.model.layout import rope_inv_freq
from random_model import FakeModel, random_weights


def tiny_config(tied: bool = False, **overrides) -> ModelConfig:
    fields = dict(arch="qwen2", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=8, qkv_bias=True, tie_word_embeddings=tied,
                  rms_norm_eps=1e-6, eos_token_ids=[])
    fields.update(overrides)
    return ModelConfig(**fields)


def tiny_model(tied: bool = False, seed: int = 0, dtype: str = "fp32") -> FakeModel:
    cfg = tiny_config(tied)
    return FakeModel(cfg, random_weights(cfg, seed, dtype), dtype)


def reference_logits(cfg: ModelConfig, weights: dict, tokens: list[int]) -> np.ndarray:
    """Plain float64 forward over the whole sequence: logits [T, V] at every position."""
    w = {k: v.astype(np.float64) for k, v in weights.items()}
    T, H, K, hd = len(tokens), cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    angles = np.arange(T)[:, None] * rope_inv_freq(cfg)[None, :]
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]

    def norm(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg.rms_norm_eps) * g

    def rope(x):
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

    x = w["embed.weight"][tokens]
    causal = np.tril(np.ones((T, T), bool))
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        h = norm(x, w[p + "attn_norm.weight"])
        qkv = h @ w[p + "wqkv.weight"].T + w.get(p + "wqkv.bias", 0)
        q = rope(qkv[:, : H * hd].reshape(T, H, hd))
        k = rope(qkv[:, H * hd: (H + K) * hd].reshape(T, K, hd))
        v = qkv[:, (H + K) * hd:].reshape(T, K, hd)
        k, v = np.repeat(k, H // K, axis=1), np.repeat(v, H // K, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd)
        s = np.where(causal, s, -np.inf)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        x = x + np.einsum("hts,shd->thd", a, v).reshape(T, H * hd) @ w[p + "wo.weight"].T
        gate, up = np.split(norm(x, w[p + "mlp_norm.weight"]) @ w[p + "w_gate_up.weight"].T, 2, -1)
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "w_down.weight"].T
    head = w.get("lm_head.weight", w["embed.weight"])
    return norm(x, w["norm.weight"]) @ head.T


def fresh(request: Request, **changes) -> Request:
    return dataclasses.replace(request, output=[], logprobs=[], finish_reason=None, **changes)


def prompt(seed: int, length: int, vocab: int = 64) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab, length).tolist()


def run_alone(model, request: Request, **engine_kwargs) -> Request:
    engine_kwargs.setdefault("max_seq_len", 256)
    return Engine(model, max_batch_size=4, **engine_kwargs).generate([fresh(request)])[0]


def assert_same_generation(got: Request, want: Request):
    assert got.output == want.output
    assert got.logprobs == want.logprobs  # bit-identical, not close
    assert got.finish_reason == want.finish_reason


# ------------------------------------------------------------------ against the plain forward

@pytest.mark.parametrize("tied", [False, True])
def test_prefill_and_decode_match_plain_forward(tied):
    model = tiny_model(tied)
    tokens = prompt(1, 150)  # crosses KEY_BLOCK and PREFILL_CHUNK boundaries
    ref = reference_logits(model.cfg, model.weights, tokens)
    backend = NumpyBackend(model.cfg, "fp32", max_batch_size=4, max_seq_len=256)
    backend.load_weights(model.weights)

    first = 70
    prefill_logits = backend.prefill(1, tokens[:first], 0)
    assert prefill_logits.dtype == np.float32 and prefill_logits.shape == (64,)
    np.testing.assert_allclose(prefill_logits, ref[first - 1], rtol=1e-5, atol=1e-5)
    decoded = {}
    for t in range(first, len(tokens)):
        decoded[t] = backend.decode([1], [tokens[t]], [t])[0]
    diffs = np.array([np.abs(decoded[t] - ref[t]).max() for t in decoded])
    print(f"decode vs float64 reference: max {diffs.max():.2e}, mean {diffs.mean():.2e}")
    for t in decoded:
        np.testing.assert_allclose(decoded[t], ref[t], rtol=1e-5, atol=1e-5)

    # prefill of the same tokens, whole or appended in pieces, gives the decode logits bit for bit
    np.testing.assert_array_equal(backend.prefill(2, tokens[:130], 0), decoded[129])
    backend.prefill(3, tokens[:40], 0)
    np.testing.assert_array_equal(backend.prefill(3, tokens[40:149], 40), decoded[148])
    assert KEY_BLOCK < 130


def test_decode_rows_do_not_depend_on_the_batch():
    model = tiny_model()
    backend = NumpyBackend(model.cfg, "fp32", max_batch_size=4, max_seq_len=256)
    backend.load_weights(model.weights)
    seqs = {0: prompt(2, 90), 1: prompt(3, 10), 2: prompt(4, 66)}
    for slot, toks in seqs.items():
        backend.prefill(slot, toks[:-1], 0)
    alone = {s: backend.decode([s], [t[-1]], [len(t) - 1])[0] for s, t in seqs.items()}
    batch = backend.decode([2, 0, 1], [seqs[s][-1] for s in (2, 0, 1)],
                           [len(seqs[s]) - 1 for s in (2, 0, 1)])  # rewrites the same positions
    for row, slot in enumerate((2, 0, 1)):
        np.testing.assert_array_equal(batch[row], alone[slot])
    params = SamplingBatch(seeds=[1, 2, 3], request_ids=[4, 5, 6], token_indices=[0, 7, 2],
                           temperatures=[1.0, 0.5, 0.0], greedy=[False, False, True])
    tokens, logprobs = backend.decode_sample([2, 0, 1], [seqs[s][-1] for s in (2, 0, 1)],
                                             [len(seqs[s]) - 1 for s in (2, 0, 1)], params)
    want_tokens, want_logprobs = sample(batch, params)
    np.testing.assert_array_equal(tokens, want_tokens)
    np.testing.assert_array_equal(logprobs, want_logprobs)
    firsts = backend.prefill_batch([3, 1], [seqs[0][:20], seqs[2][:5]])
    np.testing.assert_array_equal(firsts[1], backend.prefill(0, seqs[2][:5]))


def test_a_freed_slot_forgets_its_sequence():
    model = tiny_model()
    backend = NumpyBackend(model.cfg, "fp16", max_batch_size=2, max_seq_len=128)
    backend.load_weights(model.weights)
    short = prompt(5, 10)
    want = backend.prefill(1, short, 0)
    backend.prefill(0, prompt(6, 100), 0)
    backend.cache.data[0, :, 1, :, 50] = np.inf  # as if an earlier sequence had overflowed
    backend.free(0)
    np.testing.assert_array_equal(backend.prefill(0, short, 0), want)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_a_repeated_prompt_is_prefilled_once_with_the_same_bits(dtype, monkeypatch):
    """prefill_batch computes a prompt that several slots share from position 0 once and copies
    its cache rows: the logits, every cached value and the next decode step are those of
    prefilling each slot alone; a prefill that continues a slot's cache is never shared."""
    model = tiny_model()
    shared, other = prompt(7, 70), prompt(8, 20)
    slots, prompts = [0, 2, 1, 3], [shared, other, shared, shared]

    def fresh_backend():
        backend = NumpyBackend(model.cfg, dtype, max_batch_size=5, max_seq_len=128)
        backend.load_weights(model.weights)
        return backend

    alone = fresh_backend()
    want = np.stack([alone.prefill(s, p, 0) for s, p in zip(slots, prompts)])
    batched = fresh_backend()
    computed = []
    monkeypatch.setattr(batched, "prefill", lambda slot, ids, start=0: computed.append(slot)
                        or NumpyBackend.prefill(batched, slot, ids, start))
    got = batched.prefill_batch(slots, prompts)
    assert computed == [0, 2]  # slots 1 and 3 copied slot 0's rows
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(batched.cache.data, alone.cache.data)
    np.testing.assert_array_equal(batched.cache.lengths, alone.cache.lengths)
    step = dict(slots=[3, 1, 0], tokens=[5, 6, 7], positions=[70, 70, 70])
    np.testing.assert_array_equal(batched.decode(**step), alone.decode(**step))
    # from a later position the slot's own cache matters: computed for each slot
    computed.clear()
    batched.prefill_batch([0, 1], [[9, 9], [9, 9]], start_positions=[71, 71])
    assert computed == [0, 1]


# ------------------------------------------------------------------ engine invariances

@pytest.mark.parametrize("greedy", [False, True])
def test_request_alone_equals_request_in_a_changing_batch(greedy):
    model = tiny_model()
    a = Request(7, prompt(10, 70), max_new_tokens=30, temperature=0.9, greedy=greedy, seed=3)
    alone = run_alone(model, a)
    assert len(alone.output) == 30 and alone.finish_reason == "length"

    engine = Engine(model, max_batch_size=4, max_seq_len=256)
    others = [Request(1, prompt(11, 5), 50, seed=1), Request(2, prompt(12, 20), 8, greedy=True),
              Request(3, prompt(13, 100), 50, temperature=1.3, seed=3),
              Request(4, prompt(14, 3), 50, temperature=0.5)]
    engine.add(others[0])
    for _ in range(3):
        engine.step()
    in_batch = fresh(a)
    engine.add(in_batch)
    engine.step()
    engine.add(others[1])
    engine.add(others[2])
    engine.add(others[3])  # waits for a free slot: admitted when request 2 finishes
    while in_batch.finish_reason is None:
        engine.step()
    assert_same_generation(in_batch, alone)
    assert others[3].output, "the waiting request should have been admitted meanwhile"


@pytest.mark.parametrize("greedy", [False, True])
def test_cancel_and_resume_equals_uninterrupted(greedy):
    model = tiny_model(tied=True)
    a = Request(5, prompt(20, 60), max_new_tokens=25, temperature=1.1, greedy=greedy, seed=9)
    whole = run_alone(model, a)

    engine = Engine(model, max_batch_size=3, max_seq_len=256)
    part = fresh(a)
    engine.add(Request(1, prompt(21, 9), 40, seed=2))
    engine.add(part)
    while len(part.output) < 11:
        engine.step()
    cancelled = engine.cancel(5)
    assert cancelled is part and part.finish_reason is None
    assert part.output == whole.output[: len(part.output)]
    assert part.logprobs == whole.logprobs[: len(part.logprobs)]

    # resume in another engine, in another batch, started at another step
    other = Engine(model, max_batch_size=3, max_seq_len=256)
    other.add(Request(2, prompt(22, 30), 40, temperature=0.7))
    other.step()
    other.add(part)
    other.add(Request(3, prompt(23, 2), 40, greedy=True))
    while part.finish_reason is None:
        other.step()
    assert_same_generation(part, whole)

    # cancel_all mid-flight, then resume everything in the same engine
    engine.cancel_all()
    again = fresh(a)
    engine.add(again)
    engine.step()
    engine.step()
    assert [r.request_id for r in engine.cancel_all()] == [5]
    engine.generate([again])
    assert_same_generation(again, whole)


def test_cancel_waiting_and_unknown():
    engine = Engine(tiny_model(), max_batch_size=1, max_seq_len=64)
    engine.add(Request(1, [1, 2], 10))
    engine.add(Request(2, [3], 10))
    engine.step()
    waiting = engine.cancel(2)
    assert waiting.output == [] and waiting.finish_reason is None
    with pytest.raises(KeyError, match="neither running nor waiting"):
        engine.cancel(99)
    assert [r.request_id for r in engine.cancel_all()] == [1]
    assert engine.num_unfinished == 0


# ------------------------------------------------------------------ stopping

def test_stop_on_eos_includes_the_eos_token():
    model = tiny_model()
    a = Request(3, prompt(30, 12), max_new_tokens=40, seed=4)
    whole = run_alone(model, a, eos_ids=[])
    eos = whole.output[6]
    stop = whole.output.index(eos)
    got = run_alone(model, a, eos_ids=[eos, 999])
    assert got.finish_reason == "eos"
    assert got.output == whole.output[: stop + 1] and got.logprobs == whole.logprobs[: stop + 1]
    # the default eos ids come from the model config
    cfg_eos = FakeModel(dataclasses.replace(model.cfg, eos_token_ids=[eos]), model.weights)
    assert run_alone(cfg_eos, a).output == got.output


def test_stop_on_length_and_max_seq_len():
    model = tiny_model()
    a = Request(3, prompt(31, 12), max_new_tokens=40, seed=4)
    whole = run_alone(model, a)
    five = run_alone(model, fresh(a, max_new_tokens=5))
    assert five.output == whole.output[:5] and five.finish_reason == "length"
    none = run_alone(model, fresh(a, max_new_tokens=0))
    assert none.output == [] and none.finish_reason == "length"
    capped = run_alone(model, a, max_seq_len=12 + 6)  # room for 6 tokens after the prompt
    assert capped.output == whole.output[:6] and capped.finish_reason == "length"
    with pytest.raises(ValueError, match="max_seq_len"):
        Engine(model, max_seq_len=12).add(fresh(a))


# ------------------------------------------------------------------ weights

def test_update_weights_refused_in_flight_then_applied():
    model = tiny_model(seed=0)
    new_weights = random_weights(model.cfg, seed=1)
    before = {k: v.copy() for k, v in model.weights.items()}
    a = Request(1, prompt(40, 20), max_new_tokens=15, seed=2)

    engine = Engine(model, max_batch_size=2, max_seq_len=128)
    engine.add(fresh(a))
    engine.step()
    with pytest.raises(RuntimeError, match="cancel or finish them first"):
        engine.update_weights(new_weights)
    engine.cancel_all()
    engine.update_weights(new_weights)
    got = engine.generate([fresh(a)])[0]
    assert_same_generation(got, run_alone(FakeModel(model.cfg, new_weights), a))
    # the caller's arrays are untouched
    assert all(np.array_equal(model.weights[k], before[k]) for k in before)

    # a subset: only the final norm changes
    engine.update_weights({"norm.weight": model.weights["norm.weight"]})
    merged = dict(new_weights, **{"norm.weight": model.weights["norm.weight"]})
    got = engine.generate([fresh(a)])[0]
    assert_same_generation(got, run_alone(FakeModel(model.cfg, merged), a))

    with pytest.raises(ValueError, match="unexpected tensor 'nope'"):
        engine.update_weights({"nope": np.zeros(3, np.float32)})
    with pytest.raises(ValueError, match="'norm.weight' has shape"):
        engine.update_weights({"norm.weight": np.zeros(3, np.float32)})


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_half_precision_storage(dtype):
    master = tiny_model()
    model = FakeModel(master.cfg, {k: round_to(v, dtype) for k, v in master.weights.items()}, dtype)
    engine = Engine(model, max_batch_size=2, max_seq_len=128)
    backend = engine.backend
    storage = np.float16 if dtype == "fp16" else np.float32
    for name, value in backend.weights.items():
        assert value.dtype == storage
        want = round_to(master.weights[name], dtype)
        np.testing.assert_array_equal(value.astype(np.float32), want)
    assert backend.cache.data.dtype == storage

    tokens = prompt(50, 40)
    half_logits = backend.prefill(0, tokens, 0)
    cached = backend.cache.data[0, :, :, :, :40].astype(np.float32)
    np.testing.assert_array_equal(cached, round_to(cached, dtype))  # the cache holds dtype values
    fp32_backend = NumpyBackend(master.cfg, "fp32", 1, 128)
    fp32_backend.load_weights(master.weights)
    diff = np.abs(half_logits - fp32_backend.prefill(0, tokens, 0))
    print(f"{dtype} vs fp32 engine logits: max abs diff {diff.max():.3e}, mean {diff.mean():.3e}")
    assert 0 < diff.max() < (0.05 if dtype == "fp16" else 0.5)
    backend.free(0)

    a = Request(1, prompt(51, 10), max_new_tokens=20, seed=5)
    half, full = engine.generate([fresh(a)])[0], run_alone(master, a)
    lp = np.abs(np.array(half.logprobs) - np.array(full.logprobs))
    pairs = enumerate(zip(half.output, full.output))
    same = next((i for i, (x, y) in pairs if x != y), len(full.output))
    print(f"{dtype} vs fp32 generation: first differing token {same}/20, "
          f"logprob max abs diff before it {lp[:same].max() if same else 0:.3e}")
    assert len(half.output) == 20 and all(0 <= t < 64 for t in half.output)


# ------------------------------------------------------------------ API

def test_generate_order_errors_and_stats(console_last_line):
    model = tiny_model()
    engine = Engine(model, max_batch_size=2, max_seq_len=64)
    reqs = [Request(i, prompt(60 + i, 3 + i), max_new_tokens=4 + i, seed=i) for i in (3, 1, 2)]
    out = engine.generate(reqs, progress=True)
    last = console_last_line()
    assert "generate" in last and "3/3" in last and "tok_s=" in last, last
    assert [r.request_id for r in out] == [3, 1, 2]
    assert all(r.finish_reason == "length" and len(r.output) == r.max_new_tokens for r in out)
    assert engine.stats.num_generated_tokens == 7 + 5 + 6
    assert engine.stats.num_decode_steps > 0 and engine.stats.tokens_per_s > 0
    with pytest.raises(ValueError, match="request_id 1 appears more than once"):
        engine.generate([Request(1, [1], 2), Request(1, [2], 2)])
    with pytest.raises(ValueError, match="already finished"):
        engine.add(out[0])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.add(Request(9, [64], 2))
    engine.add(Request(9, [1], 2))
    with pytest.raises(ValueError, match="already running or waiting"):
        engine.add(Request(9, [2], 2))


def test_request_validation_names_the_field():
    with pytest.raises(ValueError, match="prompt"):
        Request(1, [], 3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        Request(1, [1], -1)
    with pytest.raises(ValueError, match="temperature"):
        Request(1, [1], 3, temperature=0.0)
    with pytest.raises(ValueError, match="request_id"):
        Request(-1, [1], 3)
    Request(1, [1], 3, temperature=0.0, greedy=True)  # greedy allows T = 0
    # NaN and floats compare false with every bound: refused here, not later mid-step
    for temperature, greedy in ((float("nan"), False), (float("nan"), True), (float("inf"), False)):
        with pytest.raises(ValueError, match="temperature must be finite"):
            Request(1, [1], 3, temperature=temperature, greedy=greedy)
    for bad in (float("nan"), 2.5):
        with pytest.raises(ValueError, match="max_new_tokens must be an integer"):
            Request(1, [1], bad)
    with pytest.raises(ValueError, match="seed must be an integer"):
        Request(1, [1], 3, seed=1.0)
    assert Request(1, [1], np.int64(3), seed=np.int64(-4)).seed == -4  # NumPy ints are ints


def test_any_int_seed_draws_as_its_value_modulo_2_32():
    """2**64 overflowed the sampling batch's int64 mid-step; the key is the seed modulo 2**32."""
    model = tiny_model()
    base = Request(0, prompt(7, 5), max_new_tokens=6)
    want = run_alone(model, fresh(base, seed=3))
    for seed in (3 + 2**32, 3 + 2**64, 3 - 2**40):
        assert_same_generation(run_alone(model, fresh(base, seed=seed)), want)


def test_a_generate_that_fails_midway_leaves_the_engine_usable(monkeypatch):
    """An error (or Ctrl-C) inside a step used to leave the batch's requests admitted, so the
    next generate tripped over sequences never prefilled; now the batch is cancelled."""
    model = tiny_model()
    engine = Engine(model, max_batch_size=2, max_seq_len=64)
    batch = [Request(i, prompt(20 + i, 4), max_new_tokens=5, seed=i) for i in range(3)]
    real = engine.backend.decode_sample_async
    calls = []

    def fail_on_the_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("injected backend failure")
        return real(*args, **kwargs)

    monkeypatch.setattr(engine.backend, "decode_sample_async", fail_on_the_third)
    with pytest.raises(RuntimeError, match="injected"):
        engine.generate(batch)
    assert engine.num_unfinished == 0
    assert all(r.finish_reason is None for r in batch)  # cancelled, as a cancel leaves them
    monkeypatch.setattr(engine.backend, "decode_sample_async", real)
    again = Request(9, prompt(30, 4), max_new_tokens=5, seed=9)
    got = engine.generate([again])[0]
    assert_same_generation(got, run_alone(model, again, max_seq_len=64))
