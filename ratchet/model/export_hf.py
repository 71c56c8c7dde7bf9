"""A converted (or trained) model back in the Hugging Face format, for transformers and vLLM.

The inverse of convert_hf: the engine names mapped back through the same literal map, the
fused `wqkv` / `w_gate_up` cut into their parts, a Qwen2 / Llama `config.json` and
`generation_config.json` written from the ModelConfig, and the tokenizer files copied.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from ratchet.errors import InputError
from ratchet.model import safetensors_io
from ratchet.model.config import ModelConfig
from ratchet.model.convert_hf import (
    ARCHITECTURES,
    FUSIONS,
    LAYER_INDEX,
    WEIGHT_MAP,
    unfused_shapes,
)
from ratchet.model.dtypes import round_to
from ratchet.model.io import EngineModel, copy_tokenizer_files, replace_dir, temporary_dir

HF_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
ENGINE_TO_HF = {engine: hf for hf, engine in WEIGHT_MAP.items() if engine is not None}


def hf_config(cfg: ModelConfig, dtype: str) -> dict:
    """The transformers config of `cfg` (what Qwen2Config / LlamaConfig read back)."""
    architecture = next(name for name, arch in ARCHITECTURES.items() if arch == cfg.arch)
    out = {
        "architectures": [architecture], "model_type": cfg.arch,
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim, "hidden_act": "silu", "rope_theta": cfg.rope_theta,
        "rms_norm_eps": cfg.rms_norm_eps, "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": cfg.tie_word_embeddings, "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_ids[0] if len(cfg.eos_token_ids) == 1 else cfg.eos_token_ids or None,
        "pad_token_id": cfg.pad_token_id, "torch_dtype": HF_DTYPES[dtype],
    }
    if cfg.rope_scaling is not None:
        out["rope_scaling"] = dict(cfg.rope_scaling)
    if cfg.arch == "qwen2":
        out["use_sliding_window"] = False
    elif cfg.qkv_bias:
        raise InputError("export: a Llama model with q/k/v biases has no Hugging Face form "
                         "(LlamaConfig.attention_bias also adds an o_proj bias)")
    return out


def hf_parts(cfg: ModelConfig, name: str, rows: int) -> list[tuple[str, int, int]]:
    """(Hugging Face name, first row, end row) of each part of the engine tensor `name` of
    `rows` rows: one part for an unfused tensor, q/k/v or gate/up for a fused one."""
    parts_shape = unfused_shapes(cfg)
    layer = LAYER_INDEX.findall(name)[:1]
    template = LAYER_INDEX.sub("{}", name, count=1)
    parts = [p.format(*layer) for p in FUSIONS.get(template, (template,))]
    offsets = np.cumsum([0] + [parts_shape[p][0] if p in parts_shape else rows for p in parts])
    return [(ENGINE_TO_HF[LAYER_INDEX.sub("{}", part, count=1)].format(*layer), int(begin), int(end))
            for part, begin, end in zip(parts, offsets[:-1], offsets[1:])]


def hf_tensors(cfg: ModelConfig, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Engine tensors under their Hugging Face names, fused ones cut back into their parts."""
    out: dict[str, np.ndarray] = {}
    for name, tensor in weights.items():
        for hf_name, begin, end in hf_parts(cfg, name, tensor.shape[0]):
            out[hf_name] = np.ascontiguousarray(tensor[begin:end])
    return out


def export_hf(model: EngineModel, out_dir: str | Path, dtype: str, tokenizer_dir: str | Path | None,
              card: str | None = None) -> dict:
    """Write `out_dir` (config.json, generation_config.json, model.safetensors in `dtype`,
    tokenizer files unless `tokenizer_dir` is None: vLLM fed token ids needs none; `card`, a
    README.md, in place of the source's, which describes another model) through a temporary
    directory swapped in by renames, so a kill never leaves a half-written one in place;
    returns what the export record holds (`lossless`: against `model`'s own weights)."""
    out_dir = Path(out_dir)
    tensors = hf_tensors(model.cfg, model.weights)
    lossless = all(np.array_equal(round_to(w, dtype), w) for w in tensors.values())
    tmp = temporary_dir(out_dir)
    try:
        safetensors_io.save(tmp / "model.safetensors", tensors, dtype, metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(hf_config(model.cfg, dtype), indent=2) + "\n")
        if tokenizer_dir is not None:
            copy_tokenizer_files(tokenizer_dir, tmp)
            (tmp / "README.md").unlink(missing_ok=True)  # the source's model card
        # the source's sampling defaults kept, its token ids the model's own
        generation = _json_or_empty(tmp / "generation_config.json") | {
            "bos_token_id": model.cfg.bos_token_id, "eos_token_id": model.cfg.eos_token_ids or None,
            "pad_token_id": model.cfg.pad_token_id}
        (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
        if card is not None:
            (tmp / "README.md").write_text(card)
        replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for path in sorted(out_dir.iterdir()):
        print(f"wrote {path}")
    return {"path": str(out_dir), "dtype": dtype, "lossless": lossless, "num_tensors": len(tensors)}


def _json_or_empty(path: Path) -> dict:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
