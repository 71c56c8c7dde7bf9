"""Policy.token_logprobs against plain references: full logits, other chunkings, lone rows,
pre-rounded weights (the straight-through fix) and direct entropy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from full_logits import full_logits

from ratchet.model.config import ModelConfig
from ratchet.model.dtypes import round_to
from ratchet.model.layout import expected_shapes
from ratchet.trainer.policy import Policy

VOCAB = 50


def make_cfg(tied: bool = False) -> ModelConfig:
    return ModelConfig(arch="qwen2", vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
                       num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, rope_theta=10000.0,
                       tie_word_embeddings=tied, qkv_bias=True)


def random_weights(cfg: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in expected_shapes(cfg).items():
        noise = rng.standard_normal(shape).astype(np.float32)
        out[name] = 1 + 0.1 * noise if "norm" in name else 0.3 * noise
    return out


def make_policy(tied: bool = False, weights=None) -> Policy:
    cfg = make_cfg(tied)
    policy = Policy(cfg)
    policy.load_weights(random_weights(cfg) if weights is None else weights)
    return policy


def random_batch(seed: int = 0, rows: int = 4):
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, VOCAB, rng.integers(1, 9)).tolist() for _ in range(rows)]
    responses = [rng.integers(0, VOCAB, rng.integers(1, 12)).tolist() for _ in range(rows)]
    return prompts, responses


def reference_logprobs(policy: Policy, prompts, responses, temperature=1.0):
    """Row by row, no padding: full logits, log_softmax, gather; and the entropies."""
    out, entropies = [], []
    for prompt, response in zip(prompts, responses):
        ids = torch.tensor([prompt + response])
        logp = torch.log_softmax(full_logits(policy, ids)[0].float() / temperature, dim=-1)  # [T, V]
        pos = torch.arange(len(prompt) - 1, len(prompt) - 1 + len(response))
        out.append(logp[pos, torch.tensor(response)])
        entropies.append(-(logp[pos].exp() * logp[pos]).sum(-1))
    return out, entropies


def max_diff(a: torch.Tensor, b: torch.Tensor, label: str = "") -> float:
    d = (a - b).abs()
    print(f"{label} max |diff| = {d.max().item():.2e}, mean = {d.mean().item():.2e}")
    return d.max().item()


def test_state_dict_keys_are_engine_names():
    for tied in (False, True):
        policy = make_policy(tied)
        assert list(policy.state_dict()) == list(expected_shapes(policy.cfg))
        exported = policy.export_weights()
        assert list(exported) == list(expected_shapes(policy.cfg))
        assert all(t.dtype == torch.float32 and not t.requires_grad for t in exported.values())
        again = Policy(policy.cfg)
        again.load_weights(exported)
        assert all(torch.equal(again.state_dict()[k], v) for k, v in exported.items())


@pytest.mark.parametrize("tied", [False, True])
def test_token_logprobs_equal_full_log_softmax(tied):
    policy = make_policy(tied)
    prompts, responses = random_batch(1)
    with torch.no_grad():
        logprobs, mask, entropy = policy.token_logprobs(prompts, responses, temperature=0.7,
                                                        with_entropy=True)
        ref, ref_entropy = reference_logprobs(policy, prompts, responses, temperature=0.7)
    for b, response in enumerate(responses):  # the mask is the first len(response) columns
        assert mask[b, :len(response)].all() and not mask[b, len(response):].any()
    assert (logprobs[~mask] == 0).all() and (entropy[~mask] == 0).all()
    for b in range(len(prompts)):
        n = len(responses[b])
        assert max_diff(logprobs[b, :n], ref[b], "logprob") <= 1e-5
        assert max_diff(entropy[b, :n], ref_entropy[b], "entropy") <= 1e-5


def test_chunk_size_does_not_change_the_answer():
    policy = make_policy()
    prompts, responses = random_batch(2)
    with torch.no_grad():
        big, _, big_entropy = policy.token_logprobs(prompts, responses, chunk_size=10_000,
                                                    with_entropy=True)
        for chunk in (1, 3):
            small, _, small_entropy = policy.token_logprobs(prompts, responses, chunk_size=chunk,
                                                            with_entropy=True)
            assert max_diff(small, big, f"chunk {chunk}") <= 1e-5  # a matvec vs a matmul: an ulp or two
            assert max_diff(small_entropy, big_entropy, f"chunk {chunk} entropy") <= 1e-5


def test_row_alone_equals_row_in_padded_batch():
    policy = make_policy()
    prompts, responses = [[3, 4], [5] * 9, [6, 7, 8]], [[9, 10, 11], [12] * 14, [13]]
    with torch.no_grad():
        batch, _, _ = policy.token_logprobs(prompts, responses)
        for b in range(3):
            alone, _, _ = policy.token_logprobs(prompts[b:b + 1], responses[b:b + 1])
            assert max_diff(batch[b, :len(responses[b])], alone[0], f"row {b}") <= 1e-5


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_weight_dtype_equals_prerounded_policy(dtype):
    weights = random_weights(make_cfg())
    masters = make_policy(weights=weights)
    rounded = make_policy(weights={k: round_to(v, dtype) for k, v in weights.items()})
    prompts, responses = random_batch(3)
    with torch.no_grad():
        ours, _, _ = masters.token_logprobs(prompts, responses, weight_dtype=dtype)
        ref, _, _ = rounded.token_logprobs(prompts, responses)
        fp32, _, _ = masters.token_logprobs(prompts, responses)
    assert max_diff(ours, ref, f"{dtype} weights") == 0.0
    assert max_diff(ours, fp32, f"{dtype} vs fp32 weights") > 0  # the rounding did happen


def test_straight_through_gradient_lands_on_fp32_masters():
    weights = random_weights(make_cfg())
    masters = make_policy(weights=weights)
    rounded = make_policy(weights={k: round_to(v, "fp16") for k, v in weights.items()})
    prompts, responses = random_batch(4)
    for policy, dtype in ((masters, "fp16"), (rounded, "fp32")):
        logprobs, mask, entropy = policy.token_logprobs(prompts, responses, weight_dtype=dtype,
                                                        chunk_size=5, with_entropy=True)
        (logprobs[mask].sum() + 0.1 * entropy[mask].sum()).backward()
    worst = 0.0
    for name, p in masters.named_parameters():
        assert p.grad is not None, name
        ref = dict(rounded.named_parameters())[name].grad
        worst = max(worst, ((p.grad - ref).abs().max() / ref.abs().max()).item())
    print(f"straight-through grad: max relative |diff| over parameters = {worst:.2e}")
    assert worst <= 1e-6
    # and the masters themselves were not rounded
    assert torch.equal(masters.state_dict()["layers.0.wqkv.weight"],
                       torch.from_numpy(weights["layers.0.wqkv.weight"]))


def test_grad_path_values_equal_no_grad_path():
    policy = make_policy()
    prompts, responses = random_batch(5)
    with_grad, _, _ = policy.token_logprobs(prompts, responses, chunk_size=4)
    with torch.no_grad():
        without, _, _ = policy.token_logprobs(prompts, responses, chunk_size=4)
    assert with_grad.requires_grad
    assert max_diff(with_grad.detach(), without, "checkpointed") == 0.0


@pytest.mark.parametrize("weight_dtype,compute_dtype,bound", [
    ("fp32", "bf16", 0.2), ("fp32", "fp16", 0.05), ("fp16", "fp16", 0.05), ("bf16", "bf16", 0.2)])
def test_autocast_runs_and_differs_slightly(weight_dtype, compute_dtype, bound):
    policy = make_policy()
    prompts, responses = random_batch(6)
    with torch.no_grad():
        fp32, mask, _ = policy.token_logprobs(prompts, responses)
    low, _, entropy = policy.token_logprobs(prompts, responses, weight_dtype=weight_dtype,
                                            compute_dtype=compute_dtype, with_entropy=True)
    assert torch.isfinite(low).all() and torch.isfinite(entropy).all()
    # the log-softmax runs in fp32 even under autocast: its values are not all on the 16-bit grid
    low_dtype = torch.float16 if compute_dtype == "fp16" else torch.bfloat16
    assert (low.detach()[mask] != low.detach()[mask].to(low_dtype).float()).any()
    diff = max_diff(low.detach()[mask], fp32[mask], f"{weight_dtype} weights, {compute_dtype} compute")
    assert 0 < diff < bound
    low[mask].sum().backward()  # the gradient reaches the fp32 masters through autocast too
    grad = policy.layers[0].wqkv.weight.grad
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0


def test_temperature_zero_scores_at_one_and_bad_inputs():
    policy = make_policy()
    prompts, responses = random_batch(7)
    with torch.no_grad():
        zero, _, _ = policy.token_logprobs(prompts, responses, temperature=0.0)
        one, _, _ = policy.token_logprobs(prompts, responses, temperature=1.0)
    assert torch.equal(zero, one)
    with pytest.raises(ValueError, match="row 1: empty prompt"):
        policy.token_logprobs([[1], []], [[2], [3]])
    with pytest.raises(ValueError, match="unknown dtype"):
        policy.token_logprobs([[1]], [[2]], weight_dtype="fp8")


def test_causal_attention_gives_the_masked_answers_and_gradients():
    """train.attention causal (is_causal alone) against the explicit mask, on a right-padded
    batch of unequal rows: the same log-probs, entropy and gradient up to float order."""
    policy = make_policy()
    prompts, responses = random_batch(seed=3, rows=5)
    assert len({len(p) + len(r) for p, r in zip(prompts, responses)}) > 1  # padding is exercised
    out = {}
    for attention in ("mask", "causal"):
        policy.zero_grad()
        lp, mask, ent = policy.token_logprobs(prompts, responses, with_entropy=True, attention=attention)
        (lp[mask].sum() + ent[mask].sum()).backward()
        out[attention] = (lp.detach(), ent.detach(), [p.grad.clone() for p in policy.parameters()])
    (lp_m, ent_m, g_m), (lp_c, ent_c, g_c) = out["mask"], out["causal"]
    assert max_diff(lp_c[mask], lp_m[mask], "log-probs") < 1e-5
    assert max_diff(ent_c[mask], ent_m[mask], "entropy") < 1e-5
    for a, b in zip(g_c, g_m):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="attention 'flash'"):
        policy.token_logprobs(prompts, responses, attention="flash")


@pytest.mark.parametrize("weight_dtype,attention,compute_dtype", [
    ("fp32", "mask", "fp32"), ("fp32", "causal", "fp32"), ("fp16", "causal", "fp32"), ("bf16", "causal", "bf16")])
def test_gradient_checkpointing_gives_the_same_bits(weight_dtype, attention, compute_dtype):
    """Each layer recomputed in the backward (train/ablate.gradient_checkpointing): the same
    log-probs, entropy and gradient of every parameter bit for bit as the plain backward, on
    the masters and on the rounded weights (the fix's forward: its recompute must find them
    again, not the masters), in fp32 and under autocast."""
    policy = make_policy()
    prompts, responses = random_batch(seed=4, rows=5)
    out = {}
    for recompute in (False, True):
        policy.zero_grad()
        lp, mask, ent = policy.token_logprobs(prompts, responses, with_entropy=True, attention=attention,
                                              weight_dtype=weight_dtype, compute_dtype=compute_dtype,
                                              gradient_checkpointing=recompute)
        (lp[mask].sum() + 0.1 * ent[mask].sum()).backward()
        out[recompute] = [lp.detach(), ent.detach()] + [p.grad.clone() for p in policy.parameters()]
    for plain, recomputed in zip(out[False], out[True]):
        assert torch.equal(plain.view(torch.int32), recomputed.view(torch.int32))
    assert any(g.abs().sum() > 0 for g in out[True][2:])


@pytest.mark.gpu
@pytest.mark.parametrize("weight_dtype,compute_dtype", [("fp32", "fp32"), ("fp16", "fp32"), ("fp16", "fp16")])
def test_gradient_checkpointing_gives_the_same_bits_on_cuda(weight_dtype, compute_dtype):
    """As above on the GPU, where the recompute must pick the same cuBLAS and attention kernels
    (fp32: memory-efficient attention; fp16 autocast: flash) at answers of GSM8K's lengths."""
    cfg = ModelConfig(arch="qwen2", vocab_size=2000, hidden_size=256, intermediate_size=704, num_layers=4,
                      num_heads=4, num_kv_heads=2, head_dim=64, rope_theta=10000.0, tie_word_embeddings=False,
                      qkv_bias=True)
    from random_model import random_weights as scaled_weights  # activations O(1): no fp16 overflow

    policy = Policy(cfg)
    policy.load_weights(scaled_weights(cfg, seed=1))
    policy.cuda()
    rng = np.random.default_rng(2)
    prompts = [rng.integers(0, 2000, rng.integers(40, 120)).tolist() for _ in range(8)]
    responses = [rng.integers(0, 2000, rng.integers(10, 300)).tolist() for _ in range(8)]
    out = {}
    for recompute in (False, True):
        policy.zero_grad()
        lp, mask, ent = policy.token_logprobs(prompts, responses, with_entropy=True, attention="causal",
                                              weight_dtype=weight_dtype, compute_dtype=compute_dtype,
                                              gradient_checkpointing=recompute)
        (lp[mask].sum() + 0.1 * ent[mask].sum()).backward()
        out[recompute] = [lp.detach(), ent.detach()] + [p.grad.clone() for p in policy.parameters()]
    for plain, recomputed in zip(out[False], out[True]):
        assert torch.equal(plain.view(torch.int32), recomputed.view(torch.int32))


def _old_rounded(policy: Policy, dtype: str) -> dict[str, torch.Tensor]:
    """The straight-through sum the cache replaced: w + (round(w) - w), once per call."""
    from ratchet.trainer.precision import torch_dtype

    return {name: p + (p.detach().to(torch_dtype(dtype)).float() - p.detach())
            for name, p in policy.named_parameters()}


@pytest.mark.parametrize("optimizer", ["plain", "foreach", "fused"])
def test_the_cached_rounding_follows_every_change_of_the_masters(optimizer):
    """Values and gradients bit for bit those of w + (round(w) - w), before and after each
    optimiser step (its in-place update moves the version counter the cache is keyed on) and a
    reload; a second forward at the same masters rounds nothing again."""
    from torch.func import functional_call

    from ratchet.trainer.precision import rounded_parameters

    policy, twin = make_policy(), make_policy()
    opts = [torch.optim.AdamW(p.parameters(), lr=1e-2, foreach=optimizer == "foreach",
                              fused=True if optimizer == "fused" else None) for p in (policy, twin)]
    prompts, responses = random_batch(3)

    def loss(module, params):
        from ratchet.trainer.policy import pack

        batch = pack(prompts, responses, "cpu")
        chosen, entropy = functional_call(module, params, (batch, 1.0, 7, True, "mask"))
        return chosen.sum() + 0.1 * entropy.sum()

    for step in range(3):
        for opt in opts:
            opt.zero_grad()
        ours, ref = loss(policy, rounded_parameters(policy, "fp16")), loss(twin, _old_rounded(twin, "fp16"))
        assert torch.equal(ours, ref), step
        ours.backward()
        ref.backward()
        for (name, p), q in zip(policy.named_parameters(), twin.parameters()):
            assert torch.equal(p.grad, q.grad), (step, name)
        for opt in opts:
            opt.step()
        assert all(torch.equal(p, q) for p, q in zip(policy.parameters(), twin.parameters()))
    weights = random_weights(make_cfg(), seed=3)
    policy.load_weights(weights)
    twin.load_weights(weights)
    with torch.no_grad():
        assert torch.equal(loss(policy, rounded_parameters(policy, "bf16")), loss(twin, _old_rounded(twin, "bf16")))
    rounded_parameters(policy, "bf16")  # the masters have not moved since: nothing to round
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        rounded_parameters(policy, "bf16")
    assert not [e.name for e in prof.events() if e.name in ("aten::_to_copy", "aten::sub", "aten::add")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rmsnorm_is_the_explicit_formula_bit_for_bit_on_the_cpu(dtype):
    """F.rms_norm (fused on CUDA) against the formula the engine implements, normalised in fp32
    and cast back before the weight: the same values and gradients, bit for bit, on the host."""
    from ratchet.trainer.policy import RMSNorm

    torch.manual_seed(0)
    norm = RMSNorm(64, 1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(64))
    x = (torch.randn(4, 9, 64) * 3).to(dtype).requires_grad_()
    grad = torch.randn(4, 9, 64)
    out = norm(x)
    out.backward(grad.to(out.dtype))
    got = (out.detach(), x.grad.clone(), norm.weight.grad.clone())
    x.grad = norm.weight.grad = None
    xf = x.float()
    want = norm.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype)
    want.backward(grad.to(want.dtype))
    for a, b in zip(got, (want.detach(), x.grad, norm.weight.grad)):
        assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_heads_values_and_gradients_are_the_plain_formulas_bit_for_bit(temperature):
    """head_chunk skips the division at temperature 1 and keeps the entropy out of autograd
    (so the checkpoint's recompute stops before it): the log-probs, the entropy and the
    gradients through a checkpointed chunk equal the plain formulas' bit for bit."""
    from torch.utils.checkpoint import checkpoint

    from ratchet.trainer.policy import head_chunk

    gen = torch.Generator().manual_seed(0)
    h = torch.randn(37, 16, generator=gen, requires_grad=True)
    w = torch.randn(101, 16, generator=gen, requires_grad=True)
    targets = torch.randint(0, 101, (37,), generator=gen)
    g = torch.randn(37, generator=gen)

    logp = torch.log_softmax((h @ w.T).float() / temperature, dim=-1)
    chosen = logp.gather(-1, targets[:, None]).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    dh, dw = torch.autograd.grad(chosen, (h, w), g)

    c, e = checkpoint(head_chunk, h, w, targets, temperature, True, use_reentrant=False)
    assert torch.equal(c, chosen) and torch.equal(e, entropy) and not e.requires_grad
    assert all(torch.equal(a, b) for a, b in zip(torch.autograd.grad(c, (h, w), g), (dh, dw)))
    c, e = head_chunk(h, w, targets, temperature, False)
    assert torch.equal(c, chosen) and e.numel() == 0
