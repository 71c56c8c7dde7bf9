"""What the benchmarks run on: Qwen2.5-0.5B's shapes with seeded random weights (no download),
and CUDA-event timing on a stream."""

from __future__ import annotations

from ratchet.model.config import ModelConfig
from ratchet.model.layout import expected_shapes


def qwen05_config() -> ModelConfig:
    return ModelConfig(arch="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864, num_layers=24,
                       num_heads=14, num_kv_heads=2, head_dim=64, rope_theta=1e6, rms_norm_eps=1e-6,
                       tie_word_embeddings=True, qkv_bias=True, eos_token_ids=[])


def coder15_config() -> ModelConfig:
    """Qwen2.5-Coder-1.5B-Instruct's shapes: head_dim 128, 6 query heads per kv head, untied."""
    return ModelConfig(arch="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_layers=28,
                       num_heads=12, num_kv_heads=2, head_dim=128, rope_theta=1e6, rms_norm_eps=1e-6,
                       tie_word_embeddings=False, qkv_bias=True, eos_token_ids=[])


def qwen7b_config() -> ModelConfig:
    """Qwen2.5-7B's shapes: 7 query heads per kv head at head_dim 128, 15 GB of fp16 weights."""
    return ModelConfig(arch="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_layers=28,
                       num_heads=28, num_kv_heads=4, head_dim=128, rope_theta=1e6, rms_norm_eps=1e-6,
                       tie_word_embeddings=False, qkv_bias=True, eos_token_ids=[])


SHAPES = {"qwen2.5-0.5b": qwen05_config, "qwen2.5-coder-1.5b": coder15_config, "qwen2.5-7b": qwen7b_config}


def init_of(name: str) -> tuple[float, float]:
    """(mean, std) of an engine tensor's seeded random init: norms near 1, biases and weights
    small, the embedding wider, so that logits spread over a few nats."""
    if "norm" in name:
        return 1.0, 0.05
    if name.endswith("bias"):
        return 0.0, 0.05
    return 0.0, 0.1 if name == "embed.weight" else 0.02


def random_torch_weights(cfg: ModelConfig, seed: int = 0) -> dict:
    """fp32 torch CUDA tensors under the engine names, seeded on the GPU, laid out in one flat
    buffer as the trainer's CUDA masters are (`flat_offsets`)."""
    import torch

    from ratchet.trainer.policy import flat_masters

    gen = torch.Generator(device="cuda").manual_seed(seed)
    out = flat_masters(cfg, "cuda")
    for name, shape in expected_shapes(cfg).items():
        mean, std = init_of(name)
        t = std * torch.randn(shape, device="cuda", generator=gen)
        out[name].copy_(t + mean if mean else t)
    torch.cuda.synchronize()
    return out


class Events:
    """CUDA-event timing on a CuPy stream: `with ev.time(stream): ...`, then ev.ms."""

    def __init__(self):
        self.ms: list[float] = []

    def time(self, stream):
        import cupy as cp

        ev = self

        class _Ctx:
            def __enter__(self):
                self.start, self.end = cp.cuda.Event(), cp.cuda.Event()
                self.start.record(stream)

            def __exit__(self, *exc):
                self.end.record(stream)
                self.end.synchronize()
                ev.ms.append(cp.cuda.get_elapsed_time(self.start, self.end))

        return _Ctx()
