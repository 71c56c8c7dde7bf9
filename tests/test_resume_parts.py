"""The two halves a resumed training stands on, each alone, on the CPU and on the GPU: an engine
made afresh continues the rollouts as the engine that served the steps before (the
uninterrupted run's), and a trainer restored from a checkpoint takes the next steps as the one
that wrote it. A SIGKILLed GPU training that resumes to other weights (tests/test_checkpoint.py)
is then traced to one half or the other."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from random_model import FakeModel, random_weights

from ratchet.model.config import ModelConfig

ROOT = Path(__file__).resolve().parents[1]

BACKENDS = ["numpy", pytest.param("cuda", marks=pytest.mark.gpu)]


def _config() -> ModelConfig:
    # Qwen2.5-0.5B's attention shape (head_dim 64, 14 heads, 2 kv heads), small elsewhere; an untied
    # head (a tied one's random model mostly repeats its last token, so answers would not vary)
    return ModelConfig(arch="qwen2", vocab_size=500, hidden_size=256, intermediate_size=512, num_layers=2,
                       num_heads=14, num_kv_heads=2, head_dim=64, qkv_bias=True, tie_word_embeddings=False,
                       rope_theta=1e6, eos_token_ids=[])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("extra_groups", [0, 2], ids=["colocated", "split"])
def test_a_fresh_engine_continues_the_rollouts_as_the_engine_that_ran_them(backend, extra_groups):
    """Steps 1 and 2 of the rollouts, after a weight update, drawn by the engine that served
    step 0 (its slots freed in the order its answers ended, its caches and graphs used) and by a
    fresh engine given the rollouts' state after step 0 as a checkpoint holds it (JSON): the
    same groups, tokens and log-probabilities bit for bit. With extra groups (split) some
    answers are cut at step 0 and resume by a prefill of their tokens so far."""
    if backend == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from ratchet.engine.engine import Engine
    from ratchet.rl.rollout import Rollouts

    cfg = _config()
    before, after = random_weights(cfg, 5, "fp16"), random_weights(cfg, 6, "fp16")
    rng = np.random.default_rng(4)
    prompts = [rng.integers(0, cfg.vocab_size, int(n)).tolist() for n in rng.integers(4, 40, 12)]

    def engine() -> Engine:  # 25 eos ids, ~5% of random weights' draws: answers end unevenly
        return Engine(FakeModel(cfg, before, "fp16"), backend=backend, max_batch_size=16, max_seq_len=160,
                      eos_ids=list(range(25)))

    def rollouts() -> Rollouts:
        return Rollouts(prompts, 4, 48, 1.0, 3, 2, extra_groups=extra_groups, max_staleness=2)

    used, running = engine(), rollouts()
    running.collect(used, 0, version=0)
    state = json.loads(json.dumps(running.state_dict()))
    if extra_groups:
        assert any(r["output"] and r["finish_reason"] is None for g in state["in_flight"] for r in g["requests"])
    used.update_weights(after)
    fresh, restored = engine(), rollouts()
    fresh.update_weights(after)
    restored.load_state_dict(state)
    for step in (1, 2):
        a, _ = running.collect(used, step, version=step)
        b, _ = restored.collect(fresh, step, version=step)
        assert [g.to_dict() for g in a] == [g.to_dict() for g in b], f"step {step}"


def _loss_step(policy, optimizer, batch, compute_dtype: str) -> None:
    """A policy-gradient-shaped step: the token mean of -log p, backward, AdamW."""
    prompts, answers = batch
    logprobs, mask, _ = policy.token_logprobs(prompts, answers, compute_dtype=compute_dtype, attention="causal")
    loss = -(logprobs * mask).sum() / mask.sum()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


@pytest.fixture
def determinism():
    """The trainings' set_determinism, process-wide while the test runs, then as it was."""
    from ratchet.rl.runtime import set_determinism

    before = torch.are_deterministic_algorithms_enabled()
    set_determinism(0)
    yield
    torch.use_deterministic_algorithms(before)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("compute_dtype", ["fp32", "bf16"])
def test_a_restored_trainer_takes_the_next_steps_as_the_one_that_wrote_the_checkpoint(tmp_path, device,
                                                                                        compute_dtype, determinism):
    """Two steps, a checkpoint through the files (save_checkpoint, load_checkpoint), two more:
    a fresh policy and AdamW (fused on the GPU) restored from it end with the same masters."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from ratchet import config as config_mod
    from ratchet.rl.checkpoint import load_checkpoint, save_checkpoint
    from ratchet.rl.job import restore_trainer, trainer_tensors
    from ratchet.rl.settings import GRPOConfig
    from ratchet.rl.update import make_optimizer
    from ratchet.trainer.policy import Policy

    cfg = _config()
    weights = random_weights(cfg, 1, "fp32")
    # the default profile's AdamW at a large lr: a restore that lost a bit of state shows at once
    grpo = GRPOConfig.from_config(config_mod.load(ROOT / "config" / "config.yaml", ["train.lr=1e-3"]))
    rng = np.random.default_rng(0)
    batches = [([rng.integers(0, cfg.vocab_size, 9).tolist() for _ in range(4)],
                [rng.integers(0, cfg.vocab_size, int(n)).tolist() for n in rng.integers(3, 20, 4)])
               for _ in range(4)]

    def start():
        policy = Policy.from_weights(cfg, weights, device=device)
        return policy, make_optimizer(policy, grpo)

    policy, optimizer = start()
    for batch in batches[:2]:
        _loss_step(policy, optimizer, batch, compute_dtype)
    saved = save_checkpoint(tmp_path, 2, trainer_tensors(policy, optimizer), {})
    for batch in batches[2:]:
        _loss_step(policy, optimizer, batch, compute_dtype)

    restored, restored_optimizer = start()
    tensors, _ = load_checkpoint(saved)
    restore_trainer(restored, restored_optimizer, tensors)
    for batch in batches[2:]:
        _loss_step(restored, restored_optimizer, batch, compute_dtype)
    for (name, a), b in zip(policy.export_weights().items(), restored.export_weights().values()):
        assert torch.equal(a, b), name
