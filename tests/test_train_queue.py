"""The trainer's passes on a GPU queue their kernels without waiting for it: no upload from
pageable memory and no read-back inside a mini-batch (each would idle the GPU while the host
prepares the next pass: the train phase was bound by its host)."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest
from test_engine import tiny_model

pytestmark = pytest.mark.gpu


def test_a_mini_batch_of_several_passes_makes_no_synchronizing_call():
    import torch

    from ratchet.config import validate
    from ratchet.rl.experience import Experience
    from ratchet.rl.settings import GRPOConfig
    from ratchet.rl.update import backward_loss
    from ratchet.trainer.policy import Policy

    model = tiny_model()
    policy = Policy.from_weights(model.cfg, model.weights, device="cuda")
    cfg = dataclasses.replace(GRPOConfig.from_config(validate({})), micro_batch_size=2, compute_dtype="fp16")
    rng = np.random.default_rng(0)
    n = 8
    prompts = [rng.integers(0, model.cfg.vocab_size, 5 + i).tolist() for i in range(n)]
    answers = [rng.integers(0, model.cfg.vocab_size, 3 + 2 * i).tolist() for i in range(n)]
    exp = Experience.from_answers(prompts, answers, [[-1.0] * len(a) for a in answers],
                                  [[0] * len(a) for a in answers], np.zeros(n), rng.normal(size=n),
                                  np.ones(n, dtype=bool), ["stop"] * n, np.repeat(np.arange(2), 4),
                                  version=0, device="cuda")
    rows = list(range(n))
    for _ in backward_loss(policy, exp, rows, 40.0, cfg, scored=False):  # warm-up: pinned blocks, kernels
        pass
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            passes = sum(1 for _ in backward_loss(policy, exp, rows, 40.0, cfg, scored=False))
        finally:
            torch.cuda.set_sync_debug_mode(0)
    assert passes == 4
    # torch's own notice that the debug mode is a prototype is not a synchronizing call
    syncs = [str(w.message) for w in seen
             if "synchroniz" in str(w.message).lower() and "prototype feature" not in str(w.message)]
    assert not syncs, syncs
