"""Sample with the engine, score the same tokens with the trainer, measure the gap.

This joins the engine and the trainer, which never import each other.
"""

from __future__ import annotations

import numpy as np

from ratchet.engine.request import Request
from ratchet.gap import gap_metrics


def random_prompts(vocab_size: int, n: int, length: int, seed: int,
                   avoid: tuple[int, ...] = ()) -> list[list[int]]:
    """Seeded random token prompts (special tokens such as EOS avoided)."""
    rng = np.random.default_rng(seed)
    allowed = np.setdiff1d(np.arange(vocab_size), np.asarray(avoid, dtype=np.int64))
    return [rng.choice(allowed, size=length).tolist() for _ in range(n)]


def sample(engine, prompts: list[list[int]], max_new_tokens: int, seed: int,
           temperature: float = 1.0, first_id: int = 0) -> list[Request]:
    reqs = [Request(request_id=first_id + i, prompt=list(p), max_new_tokens=max_new_tokens,
                    temperature=temperature, seed=seed) for i, p in enumerate(prompts)]
    return engine.generate(reqs)


def trainer_logprobs(policy, requests: list[Request], temperature: float = 1.0,
                     weight_dtype: str = "fp32", compute_dtype: str = "fp32") -> np.ndarray:
    """The trainer's log-probabilities of every sampled token, concatenated in request order."""
    import torch

    kept = [r for r in requests if r.output]
    with torch.no_grad():
        lp, mask, _ = policy.token_logprobs([r.prompt for r in kept], [r.output for r in kept],
                                            temperature=temperature, weight_dtype=weight_dtype,
                                            compute_dtype=compute_dtype)
    return lp[mask].double().cpu().numpy()


def exact_logprobs(engine, requests: list[Request], temperature: float = 1.0,
                   batch_size: int | None = None) -> np.ndarray:
    """The same tokens scored by the engine itself (teacher forcing on its current weights),
    concatenated in request order: the exact fix's forward. A batch-invariant engine scores
    them all at once (as many as it holds): its bits are the same in any grouping, and a
    teacher-forced decode step costs the same for 8 answers as for 64 (its one bucket).
    Another engine (vLLM) scores in groups of `batch_size`, whose bits are part of what it
    measures."""
    kept = [r for r in requests if r.output]
    if getattr(engine, "batch_invariant", False):
        batch_size = None
    lps = engine.score([r.prompt for r in kept], [r.output for r in kept], temperature, batch_size)
    return np.concatenate([np.asarray(x, dtype=np.float64) for x in lps]) if kept else np.zeros(0)


def engine_logprobs(requests: list[Request]) -> np.ndarray:
    return np.concatenate([np.asarray(r.logprobs, dtype=np.float64) for r in requests if r.output])


def compare(policy, requests: list[Request], temperature: float = 1.0,
            weight_dtype: str = "fp32", compute_dtype: str = "fp32", prefix: str = "mismatch/"):
    """Gap metrics between the engine's sampling-time log-probs and one trainer variant."""
    t = trainer_logprobs(policy, requests, temperature, weight_dtype, compute_dtype)
    return gap_metrics(engine_logprobs(requests), t, prefix=prefix)
