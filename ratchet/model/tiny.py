"""A seeded random Qwen2 model written in the Hugging Face format.

It goes through `convert_hf` like a real checkpoint, so the tiny task exercises the same path,
and transformers can load it as a reference. NumPy only: same seed, same bytes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ratchet.model import safetensors_io
from ratchet.model.io import copy_tokenizer_files


def make_tiny_model(out_dir: str | Path, *, seed: int = 0, vocab_size: int = 64,
                    hidden_size: int = 64, intermediate_size: int = 128, num_layers: int = 2,
                    num_heads: int = 4, num_kv_heads: int = 2, head_dim: int | None = None,
                    tie_word_embeddings: bool = True, init_std: float = 0.02,
                    rope_theta: float = 10000.0, rms_norm_eps: float = 1e-6,
                    max_position_embeddings: int = 2048, tokenizer_dir: str | Path | None = None,
                    bos_token_id: int | None = None, eos_token_id: int | list[int] | None = None,
                    pad_token_id: int | None = None) -> Path:
    """Write config.json and model.safetensors (fp32, HF names) into `out_dir`.

    Initialised as transformers initialises Qwen2: N(0, init_std) matrices, zero biases,
    unit norms.
    """
    out_dir = Path(out_dir)
    head_dim = head_dim or hidden_size // num_heads
    config = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rope_theta": rope_theta,
        "rms_norm_eps": rms_norm_eps,
        "max_position_embeddings": max_position_embeddings,
        "tie_word_embeddings": tie_word_embeddings,
        "use_sliding_window": False,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,  # an int or a list, as in HF configs
        "pad_token_id": pad_token_id,
        "torch_dtype": "float32",
    }
    shapes = hf_shapes(config)
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, shape in shapes.items():  # a fixed order, so one seed gives one model
        if name.endswith("norm.weight"):
            tensors[name] = np.ones(shape, np.float32)
        elif name.endswith(".bias"):
            tensors[name] = np.zeros(shape, np.float32)
        else:
            tensors[name] = (rng.standard_normal(shape, dtype=np.float32) * init_std).astype(np.float32)

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    # transformers refuses safetensors files without format metadata
    safetensors_io.save(out_dir / "model.safetensors", tensors, "fp32", metadata={"format": "pt"})
    if tokenizer_dir is not None:
        copy_tokenizer_files(tokenizer_dir, out_dir)
    for path in sorted(out_dir.iterdir()):
        print(f"wrote {path}")
    return out_dir


def hf_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """The HF Qwen2 tensor names and shapes for a config dict, in a fixed order."""
    d, f, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    q = config["num_attention_heads"] * config["head_dim"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, d)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (d,),
            p + "self_attn.q_proj.weight": (q, d),
            p + "self_attn.q_proj.bias": (q,),
            p + "self_attn.k_proj.weight": (kv, d),
            p + "self_attn.k_proj.bias": (kv,),
            p + "self_attn.v_proj.weight": (kv, d),
            p + "self_attn.v_proj.bias": (kv,),
            p + "self_attn.o_proj.weight": (d, q),
            p + "post_attention_layernorm.weight": (d,),
            p + "mlp.gate_proj.weight": (f, d),
            p + "mlp.up_proj.weight": (f, d),
            p + "mlp.down_proj.weight": (d, f),
        }
    shapes["model.norm.weight"] = (d,)
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (v, d)
    return shapes
