"""engine.backend vllm on a GPU (`pytest -m gpu tests/test_vllm_gpu.py`, dev/gpu/vllm.sh): vLLM
in-process on a small random fp16 model, against ratchet's own engine on the same weights.

Tolerances, and why: vLLM computes in fp16 with its own kernels (its logits leave the head in
fp16) where ratchet accumulates the head in fp32, so the same tokens get log-probabilities a
few 1e-3 apart; we hold them to build_engine's fp16 self-test tolerance (mean |d| <= 2e-2)
and a max of 0.2. A greedy answer may leave ratchet's only at a near tie (ratchet's own
log-probabilities of the two tokens within 0.05), after which the answers are not compared.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from ratchet import device
from ratchet.engine.engine import Engine
from ratchet.engine.request import Request
from ratchet.engines import make_engine
from random_model import FakeModel, random_weights
from test_engine import tiny_config

pytestmark = pytest.mark.gpu

IN_PROCESS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_USE_V2_MODEL_RUNNER": "0",
              "VLLM_HOST_IP": "127.0.0.1", "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1",
              "TRANSFORMERS_OFFLINE": "1"}
MEAN_TOL, MAX_TOL, NEAR_TIE = 2e-2, 0.2, 0.05
SEQ = 256


@pytest.fixture(scope="module")
def model():
    if device.vllm_problem() is not None:
        pytest.skip(f"vLLM cannot run here: {device.vllm_problem()}")
    # head_dim 64: a size every vLLM attention backend takes
    cfg = tiny_config(False, vocab_size=128, hidden_size=128, intermediate_size=256, num_heads=2,
                      num_kv_heads=1, head_dim=64, max_position_embeddings=SEQ)
    return FakeModel(cfg, random_weights(cfg, seed=4, dtype="fp16"), "fp16")


@pytest.fixture(scope="module")
def vllm_engine(model):
    for key, value in IN_PROCESS.items():
        os.environ.setdefault(key, value)
    return make_engine(model, backend="vllm", max_batch_size=16, max_seq_len=SEQ, eos_ids=[])


def reference(model, weights=None):
    backend = "cuda" if device.cuda_available() else "numpy"
    m = model if weights is None else FakeModel(model.cfg, weights, model.dtype)
    return Engine(m, backend=backend, max_batch_size=16, max_seq_len=SEQ, eos_ids=[])


def prompts(n, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 128, size=int(rng.integers(4, 20))).tolist() for _ in range(n)]


def gaps(got: list[list[float]], want: list[list[float]]) -> np.ndarray:
    return np.abs(np.concatenate([np.subtract(g, w) for g, w in zip(got, want)]))


def test_every_sampled_token_has_ratchets_logprob_after_temperature(model, vllm_engine):
    reqs = vllm_engine.generate([Request(i, p, max_new_tokens=24, temperature=0.8, seed=3)
                                 for i, p in enumerate(prompts(12))])
    assert all(len(r.output) == len(r.logprobs) == 24 and r.finish_reason == "length" for r in reqs)
    assert all(np.isfinite(r.logprobs).all() for r in reqs)
    scored = reference(model).score([r.prompt for r in reqs], [r.output for r in reqs], 0.8)
    d = gaps([r.logprobs for r in reqs], scored)
    print(f"vllm vs ratchet, T=0.8: mean |dlogp| {d.mean():.2e}, max {d.max():.2e} over {d.size} tokens")
    assert d.mean() <= MEAN_TOL and d.max() <= MAX_TOL
    at_one = reference(model).score([r.prompt for r in reqs], [r.output for r in reqs], 1.0)
    assert gaps([r.logprobs for r in reqs], at_one).mean() > 5 * d.mean()  # T was applied: not raw log-probs


def test_a_cancelled_request_resumes_with_its_tokens(model, vllm_engine):
    reqs = [Request(100 + i, p, max_new_tokens=20, temperature=1.0, seed=8) for i, p in enumerate(prompts(4, 1))]
    for r in reqs:
        vllm_engine.add(r)
    for _ in range(5):
        vllm_engine.step()
    cancelled = vllm_engine.cancel_all()
    assert vllm_engine.num_unfinished == 0 and {len(r.output) for r in cancelled} <= set(range(1, 20))
    kept = {r.request_id: list(r.output) for r in cancelled}
    vllm_engine.generate(cancelled)
    for r in cancelled:
        assert r.output[:len(kept[r.request_id])] == kept[r.request_id] and len(r.output) == 20
    d = gaps([r.logprobs for r in reqs], reference(model).score([r.prompt for r in reqs], [r.output for r in reqs]))
    assert d.mean() <= MEAN_TOL and d.max() <= MAX_TOL


def check_greedy(model, vllm_engine, weights=None, first_id=0):
    ps = prompts(6, 2)
    mine = vllm_engine.generate([Request(first_id + i, p, 16, greedy=True) for i, p in enumerate(ps)])
    ref_engine = reference(model, weights)
    theirs = ref_engine.generate([Request(i, p, 16, greedy=True) for i, p in enumerate(ps)])
    scored = ref_engine.score(ps, [r.output for r in mine], 1.0)
    for a, b, lp in zip(mine, theirs, scored):
        diverge = next((j for j, (x, y) in enumerate(zip(a.output, b.output)) if x != y), None)
        if diverge is not None:  # only at a near tie of ratchet's own log-probabilities
            assert b.logprobs[diverge] - lp[diverge] < NEAR_TIE, (a.output, b.output)
        n = len(a.output) if diverge is None else diverge
        assert np.abs(np.subtract(a.logprobs[:n], b.logprobs[:n])).max(initial=0) <= MAX_TOL
    return [r.output for r in mine]


def test_greedy_answers_are_ratchets(model, vllm_engine):
    check_greedy(model, vllm_engine)


def test_a_weight_update_shows_in_the_next_sample_and_in_the_checksums(model, vllm_engine):
    assert vllm_engine.weight_checksums() == reference(model).weight_checksums()
    before = check_greedy(model, vllm_engine, first_id=200)
    new = dict(model.weights)
    new["lm_head.weight"] = -model.weights["lm_head.weight"]  # argmax becomes argmin
    rng = np.random.default_rng(1)
    new["layers.0.wqkv.weight"] = (model.weights["layers.0.wqkv.weight"]
                                   * (1 + 0.1 * rng.standard_normal(model.weights["layers.0.wqkv.weight"].shape))
                                   ).astype(np.float32)
    update = {k: new[k] for k in ("lm_head.weight", "layers.0.wqkv.weight")}
    vllm_engine.update_weights(update)  # fp32, off the fp16 grid: vLLM rounds them as ratchet does
    from ratchet.model.dtypes import round_to

    rounded = {k: round_to(v, "fp16") for k, v in new.items()}
    assert vllm_engine.weight_checksums() == reference(model, rounded).weight_checksums()
    after = check_greedy(model, vllm_engine, weights=rounded, first_id=300)
    assert before != after
    vllm_engine.update_weights({k: model.weights[k] for k in update})  # back, for the other tests
