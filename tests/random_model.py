"""A random model in the engine layout for the engine tests (NumPy and CUDA backends alike)."""

from __future__ import annotations

import dataclasses

import numpy as np

from ratchet.model.config import ModelConfig
from ratchet.model.dtypes import round_to
from ratchet.model.layout import expected_shapes


@dataclasses.dataclass
class FakeModel:  # the EngineModel duck type
    cfg: ModelConfig
    weights: dict
    dtype: str = "fp32"


def random_weights(cfg: ModelConfig, seed: int, dtype: str = "fp32") -> dict[str, np.ndarray]:
    """Seeded weights on the `dtype` grid, scaled so activations stay O(1) and the logits
    spread over a few nats."""
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in expected_shapes(cfg).items():
        if name.endswith("norm.weight"):
            w = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.endswith(".bias"):
            w = 0.1 * rng.standard_normal(shape)
        elif name == "embed.weight":
            w = rng.standard_normal(shape)
        else:
            gain = 1.5 if name == "lm_head.weight" else 1.0
            w = rng.standard_normal(shape) * gain / np.sqrt(shape[1])
        weights[name] = round_to(w.astype(np.float32), dtype)
    return weights
