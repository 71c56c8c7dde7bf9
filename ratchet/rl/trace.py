"""The run's trace: per step, SHA-256 of the rollout and the weights and the exact loss, so
`verify` can tell a rerun that is bit-identical from one that is not."""

from __future__ import annotations

import hashlib

import numpy as np

from ratchet.rl.comm import Comm
from ratchet.rl.rollout import Group
from ratchet.rl.runtime import SMALL_MODEL_PARAMS


def rollout_digests(groups: list[Group], comm: Comm) -> dict[str, str]:
    """SHA-256 of the step's rollout tokens and engine log-probs (all answers, in order)."""
    tokens = hashlib.sha256()
    logprobs = hashlib.sha256()
    for r in (r for g in groups for r in g.requests):
        tokens.update(np.asarray([len(r.prompt), len(r.output), *r.prompt, *r.output], np.int64).tobytes())
        logprobs.update(np.asarray(list(r.logprobs), np.float32).tobytes())
    return {"tokens": comm.digest(tokens.digest()), "logprobs": comm.digest(logprobs.digest())}


def trace_row(step: int, digests: dict, loss: float, policy, cfg) -> dict:
    """One step of the trace. The weights' SHA-256 costs a device-to-host copy of the model,
    so for a large model it is taken only where it is compared: the steps `verify` reruns,
    checkpoint steps and the last step ("" elsewhere)."""
    small = sum(p.numel() for p in policy.parameters()) < SMALL_MODEL_PARAMS
    wanted = (small or step < cfg.verify_steps or (step + 1) % cfg.checkpoint_every == 0
              or step + 1 == cfg.steps)
    return {"step": step, "tokens": digests["tokens"], "logprobs": digests["logprobs"],
            "loss": float_hex(loss), "weights": weights_digest(policy) if wanted else ""}


def weights_digest(policy) -> str:
    """SHA-256 of the fp32 masters in the engine layout order."""
    h = hashlib.sha256()
    for name, w in policy.export_weights().items():
        h.update(name.encode())
        h.update(memoryview(w.detach().cpu().contiguous().numpy()).cast("B"))  # no copy of the bytes
    return h.hexdigest()


def float_hex(x: float) -> str:
    """A float written exactly (for comparing losses bit for bit)."""
    return float(x).hex()
