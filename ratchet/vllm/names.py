"""Engine names <-> the names vLLM knows. A weight update reaches vLLM's `load_weights` under
Hugging Face names, the fused wqkv / w_gate_up cut into q/k/v and gate/up by export_hf's map;
vLLM fuses them again (qkv_proj, gate_up_proj: the same rows in the same order), so its own
parameters map back one to one onto the engine layout, which is what the checksums read."""

from __future__ import annotations

from typing import Mapping

from ratchet.model.config import ModelConfig
from ratchet.model.convert_hf import LAYER_INDEX
from ratchet.model.export_hf import hf_parts
from ratchet.model.layout import check_update

# engine name -> vLLM's parameter (Qwen2 / Llama in vLLM); `{}` is the layer index
VLLM_PARAMETERS = {
    "embed.weight": "model.embed_tokens.weight",
    "layers.{}.attn_norm.weight": "model.layers.{}.input_layernorm.weight",
    "layers.{}.wqkv.weight": "model.layers.{}.self_attn.qkv_proj.weight",
    "layers.{}.wqkv.bias": "model.layers.{}.self_attn.qkv_proj.bias",
    "layers.{}.wo.weight": "model.layers.{}.self_attn.o_proj.weight",
    "layers.{}.mlp_norm.weight": "model.layers.{}.post_attention_layernorm.weight",
    "layers.{}.w_gate_up.weight": "model.layers.{}.mlp.gate_up_proj.weight",
    "layers.{}.w_down.weight": "model.layers.{}.mlp.down_proj.weight",
    "norm.weight": "model.norm.weight",
    "lm_head.weight": "lm_head.weight",
}
PADDED_VOCAB = ("embed.weight", "lm_head.weight")  # vLLM pads their rows to a multiple of 64


def hf_update(cfg: ModelConfig, weights: Mapping[str, object]) -> list[tuple[str, object]]:
    """(Hugging Face name, rows) for every part of every updated engine tensor; the rows are
    views (NumPy or torch alike), nothing is copied. Every name and shape is checked first."""
    check_update(cfg, weights, "vllm update_weights")
    return [(hf_name, tensor[begin:end])
            for name, tensor in weights.items()
            for hf_name, begin, end in hf_parts(cfg, name, tensor.shape[0])]


def vllm_parameter(name: str) -> str:
    """The vLLM parameter that holds the engine tensor `name`."""
    layer = LAYER_INDEX.findall(name)[:1]
    return VLLM_PARAMETERS[LAYER_INDEX.sub("{}", name, count=1)].format(*layer)
