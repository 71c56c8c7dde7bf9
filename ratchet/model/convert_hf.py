"""Hugging Face Qwen2 / Llama checkpoint -> (ModelConfig, engine weights), without torch.

Reads `config.json` (+ `generation_config.json` for extra EOS ids) and `model.safetensors` or the
shards a `model.safetensors.index.json` lists. Renaming goes through one literal map; the fusions
(q, k, v -> wqkv; gate, up -> w_gate_up) are explicit, as in gpt-fast's converter.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from ratchet.errors import InputError, MissingInputError
from ratchet.model.config import ModelConfig
from ratchet.model.layout import check_weights, expected_shapes
from ratchet.model.safetensors_io import load_fp32

ARCHITECTURES = {"Qwen2ForCausalLM": "qwen2", "LlamaForCausalLM": "llama"}
# what config.json must state (the rest has defaults both architectures share)
REQUIRED_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads")

# HF name -> engine name before fusion; `{}` is the layer index, None means "recomputed, drop".
WEIGHT_MAP = {
    "model.embed_tokens.weight": "embed.weight",
    "model.layers.{}.input_layernorm.weight": "layers.{}.attn_norm.weight",
    "model.layers.{}.self_attn.q_proj.weight": "layers.{}.wq.weight",
    "model.layers.{}.self_attn.k_proj.weight": "layers.{}.wk.weight",
    "model.layers.{}.self_attn.v_proj.weight": "layers.{}.wv.weight",
    "model.layers.{}.self_attn.q_proj.bias": "layers.{}.wq.bias",
    "model.layers.{}.self_attn.k_proj.bias": "layers.{}.wk.bias",
    "model.layers.{}.self_attn.v_proj.bias": "layers.{}.wv.bias",
    "model.layers.{}.self_attn.o_proj.weight": "layers.{}.wo.weight",
    "model.layers.{}.self_attn.rotary_emb.inv_freq": None,
    "model.layers.{}.post_attention_layernorm.weight": "layers.{}.mlp_norm.weight",
    "model.layers.{}.mlp.gate_proj.weight": "layers.{}.w_gate.weight",
    "model.layers.{}.mlp.up_proj.weight": "layers.{}.w_up.weight",
    "model.layers.{}.mlp.down_proj.weight": "layers.{}.w_down.weight",
    "model.norm.weight": "norm.weight",
    "lm_head.weight": "lm_head.weight",
}

# Fused engine tensor -> its parts, stacked along rows in this order.
FUSIONS = {
    "layers.{}.wqkv.weight": ("layers.{}.wq.weight", "layers.{}.wk.weight", "layers.{}.wv.weight"),
    "layers.{}.wqkv.bias": ("layers.{}.wq.bias", "layers.{}.wk.bias", "layers.{}.wv.bias"),
    "layers.{}.w_gate_up.weight": ("layers.{}.w_gate.weight", "layers.{}.w_up.weight"),
}

LAYER_INDEX = re.compile(r"(?<=\.)\d+(?=\.)")


def convert_hf(src_dir: str | Path) -> tuple[ModelConfig, dict[str, np.ndarray]]:
    src_dir = Path(src_dir)
    if not src_dir.is_dir():
        raise MissingInputError(f"HF model directory not found: {src_dir}")
    cfg = read_hf_config(src_dir)
    source = load_hf_tensors(src_dir)
    _check_heads(source, cfg, src_dir / "config.json")
    weights = rename(source, WEIGHT_MAP, cfg, str(src_dir))
    return cfg, fuse(weights, cfg, str(src_dir))


def read_hf_config(src_dir: Path) -> ModelConfig:
    path = src_dir / "config.json"
    if not path.is_file():
        raise MissingInputError(f"{src_dir}: missing config.json")
    print(f"reading {path}")
    hf = _read_json(path)
    missing = [k for k in REQUIRED_KEYS if k not in hf]
    if missing:
        raise InputError(f"{path}: missing key {missing[0]!r} (a model's config.json states "
                         f"{', '.join(REQUIRED_KEYS)})")
    names = hf.get("architectures") or [hf.get("model_type")]
    arch = ARCHITECTURES.get(names[0])
    if arch is not None and hf.get("model_type") not in (None, arch):
        raise InputError(f"{path}: model_type {hf['model_type']!r} disagrees with architectures "
                         f"{names[0]!r} (which is {arch!r})")
    if arch is None:
        raise InputError(f"{path}: unsupported architecture {names[0]!r} "
                         f"(supported: {', '.join(ARCHITECTURES)})")
    _refuse_unsupported(hf, path)
    theta, scaling = _rope(hf, path)
    heads = hf["num_attention_heads"]
    if not hf.get("head_dim") and hf["hidden_size"] % heads:
        raise InputError(f"{path}: hidden_size {hf['hidden_size']} is not divisible by "
                         f"num_attention_heads {heads} (and no head_dim is given)")
    return ModelConfig(
        arch=arch,
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        rope_theta=theta,
        rope_scaling=scaling,
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        # both classes default to untied, and save_pretrained omits fields left at the default
        tie_word_embeddings=hf.get("tie_word_embeddings", False),
        qkv_bias=arch == "qwen2" or hf.get("attention_bias", False),
        max_position_embeddings=hf.get("max_position_embeddings", 32768),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_ids=_eos_ids(src_dir, hf),
        pad_token_id=hf.get("pad_token_id"),
    )


def _read_json(path: Path) -> dict:
    """A model directory's JSON file as a mapping, or one error naming the file."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise InputError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def _check_heads(source: dict, cfg: ModelConfig, path: Path) -> None:
    """The attention shape config.json states against the first layer's q and k rows, so a
    wrong head count or head_dim is named as such rather than as a tensor shape."""
    for proj, heads, key in (("q_proj", cfg.num_heads, "num_attention_heads"),
                             ("k_proj", cfg.num_kv_heads, "num_key_value_heads")):
        w = source.get(f"model.layers.0.self_attn.{proj}.weight")
        if w is not None and w.shape[0] != heads * cfg.head_dim:
            raise InputError(f"{path}: {key} {heads} x head_dim {cfg.head_dim} = {heads * cfg.head_dim} "
                             f"rows, but {proj} has {w.shape[0]}")


def _refuse_unsupported(hf: dict, path: Path) -> None:
    """Options that change the maths in ways the engine layout has no room for."""
    if hf.get("hidden_act", "silu") != "silu":
        raise InputError(f"{path}: hidden_act {hf['hidden_act']!r} is not supported (only silu)")
    if hf.get("use_sliding_window"):
        raise InputError(f"{path}: use_sliding_window=true is not supported")
    if hf.get("mlp_bias"):
        raise InputError(f"{path}: mlp_bias=true is not supported (no MLP biases in the layout)")
    if hf.get("model_type") == "llama" and hf.get("attention_bias"):
        # Llama's attention_bias also puts a bias on o_proj, which the layout does not hold.
        raise InputError(f"{path}: attention_bias=true is not supported for Llama (o_proj bias)")


def _rope(hf: dict, path: Path) -> tuple[float, dict | None]:
    """(theta, Llama-3 scaling or None), from transformers 4's `rope_theta` / `rope_scaling` or
    transformers 5's `rope_parameters` (which holds both)."""
    params = dict(hf.get("rope_parameters") or {})
    scaling = dict(hf.get("rope_scaling") or params)
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        return theta, None
    if kind != "llama3":
        raise InputError(f"{path}: rope type {kind!r} is not supported (only default and llama3)")
    keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    return theta, {"rope_type": "llama3"} | {k: scaling[k] for k in keys}


def _eos_ids(src_dir: Path, hf: dict) -> list[int]:
    """config.json's EOS ids, then generation_config.json's (Qwen instruct adds <|im_end|> there)."""
    ids: list[int] = []
    sources = [hf]
    gen_path = src_dir / "generation_config.json"
    if gen_path.is_file():
        print(f"reading {gen_path}")
        sources.append(_read_json(gen_path))
    for source in sources:
        eos = source.get("eos_token_id")
        for token in eos if isinstance(eos, list) else [eos]:
            if token is not None and token not in ids:
                ids.append(int(token))
    return ids


def load_hf_tensors(src_dir: Path) -> dict[str, np.ndarray]:
    single, index = src_dir / "model.safetensors", src_dir / "model.safetensors.index.json"
    if single.is_file():
        files = [single]
    elif index.is_file():
        print(f"reading {index}")
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise InputError(f"{index}: no 'weight_map' object (tensor name -> file)")
        files = [src_dir / name for name in dict.fromkeys(weight_map.values())]
    else:
        raise MissingInputError(f"{src_dir}: no model.safetensors or model.safetensors.index.json")
    tensors: dict[str, np.ndarray] = {}
    for path in files:
        if not path.is_file():
            raise MissingInputError(f"{src_dir}: missing shard {path.name}")
        print(f"reading {path}")
        tensors.update(load_fp32(path))
    return tensors


def rename(source: dict[str, np.ndarray], weight_map: dict[str, str | None], cfg: ModelConfig,
           where: str) -> dict[str, np.ndarray]:
    """Apply a `{}`-templated name map; check every part's presence and shape by its source name."""
    want = unfused_shapes(cfg)
    out: dict[str, np.ndarray] = {}
    for name, tensor in source.items():
        template = LAYER_INDEX.sub("{}", name, count=1)
        if template not in weight_map:
            raise InputError(f"{where}: unexpected tensor {name!r} (not in the name map)")
        target = weight_map[template]
        if target is None:
            continue
        target = target.format(*LAYER_INDEX.findall(name)[:1])
        if target == "lm_head.weight" and cfg.tie_word_embeddings:
            continue  # some tied checkpoints store the head anyway; the embedding is authoritative
        if target not in want:
            raise InputError(f"{where}: unexpected tensor {name!r} for this config")
        if tuple(tensor.shape) != want[target]:
            raise InputError(f"{where}: tensor {name!r} has shape {tuple(tensor.shape)}, "
                             f"expected {want[target]}")
        out[target] = tensor
    missing = [n for n in want if n not in out]
    if missing:
        inverse = _inverse(weight_map)
        first = inverse[LAYER_INDEX.sub("{}", missing[0], count=1)]
        first = first.format(*LAYER_INDEX.findall(missing[0])[:1])
        raise InputError(f"{where}: missing tensor {first!r}"
                         + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    return out


def _inverse(weight_map: dict[str, str | None]) -> dict[str, str]:
    return {target: source for source, target in weight_map.items() if target is not None}


def unfused_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The engine shapes with every fused tensor replaced by its parts."""
    q, kv, f = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size
    part_rows = {"wq": q, "wk": kv, "wv": kv, "w_gate": f, "w_up": f}
    shapes: dict[str, tuple[int, ...]] = {}
    for name, shape in expected_shapes(cfg).items():
        parts = fused_parts(name)
        if parts is None:
            shapes[name] = shape
            continue
        for part in parts:
            rows = part_rows[part.split(".")[-2]]
            shapes[part] = (rows, *shape[1:])
    return shapes


def fuse(weights: dict[str, np.ndarray], cfg: ModelConfig, where: str) -> dict[str, np.ndarray]:
    """Stack q, k, v into wqkv and gate, up into w_gate_up; everything else passes through."""
    out: dict[str, np.ndarray] = {}
    for name in expected_shapes(cfg):
        parts = fused_parts(name)
        if parts is None:
            out[name] = np.ascontiguousarray(weights[name], dtype=np.float32)
        else:
            # straight into float32: .astype after it copied every fused tensor a second time
            out[name] = np.concatenate([weights[p] for p in parts], axis=0, dtype=np.float32)
    check_weights(cfg, out, where)
    return out


def fused_parts(engine_name: str) -> tuple[str, ...] | None:
    layer = LAYER_INDEX.findall(engine_name)[:1]
    parts = FUSIONS.get(LAYER_INDEX.sub("{}", engine_name, count=1))
    return None if parts is None else tuple(p.format(*layer) for p in parts)
