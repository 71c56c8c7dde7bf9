"""The model's shape: one dataclass shared by the converters, the engine and the trainer.

Written next to the engine weights as `config.json`; everything that reads a converted model
reads this, never a Hugging Face config.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ratchet.errors import InputError, MissingInputError

ARCHS = ("qwen2", "llama")


@dataclass
class ModelConfig:
    arch: str  # "qwen2" or "llama": decides nothing in the maths beyond the fields below
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    # None, or the Llama-3 form: {"rope_type": "llama3", "factor", "low_freq_factor",
    # "high_freq_factor", "original_max_position_embeddings"}
    rope_scaling: dict | None = None
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    max_position_embeddings: int = 32768
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    pad_token_id: int | None = None

    def __post_init__(self):
        if self.arch not in ARCHS:
            raise InputError(f"model config: arch {self.arch!r} is not one of {ARCHS}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                     "num_heads", "num_kv_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise InputError(f"model config: {name} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise InputError(f"model config: num_heads {self.num_heads} is not a multiple of "
                             f"num_kv_heads {self.num_kv_heads}")
        if self.head_dim % 2:
            raise InputError(f"model config: head_dim {self.head_dim} must be even for RoPE")
        if self.rope_scaling is not None and self.rope_scaling.get("rope_type") != "llama3":
            raise InputError(f"model config: unsupported rope_scaling {self.rope_scaling!r} "
                             "(only rope_type 'llama3' is implemented)")
        self.eos_token_ids = [int(t) for t in self.eos_token_ids]

    @property
    def qkv_size(self) -> int:
        """Rows of the fused wqkv matrix: q heads, then k heads, then v heads."""
        return (self.num_heads + 2 * self.num_kv_heads) * self.head_dim

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        known = set(cls.__dataclass_fields__)
        unknown = set(d) - known
        if unknown:
            raise InputError(f"model config: unknown keys {sorted(unknown)}")
        return cls(**d)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "ModelConfig":
        path = Path(path)
        if not path.is_file():
            raise MissingInputError(f"model config not found: {path}")
        d = json.loads(path.read_text())
        d.pop("engine_dtype", None)  # stored beside the shape, read by load_engine_model
        return cls.from_dict(d)
