"""llama.cpp GGUF file (qwen2 or llama) -> (ModelConfig, engine weights) and a tokenizer directory.

The header is read by ratchet/model/gguf_file.py; tensors are dequantised to float32 by
ratchet/model/dequantize.py (torch, the types Qwen2.5's files use) or the `gguf` package (any
other ggml type it knows), to the same bits.
llama.cpp's converter permutes the Q and K rows of `llama` files (its RoPE kernel pairs
neighbouring dimensions, HF's rotate-half pairs i with i + head_dim/2); we undo that, as
transformers' `LlamaTensorProcessor` does. `qwen2` files are not permuted. The tokenizer is
rebuilt from the metadata: byte-level BPE with Qwen2's pre-tokenizer by gguf_tokenizer.py,
any other by transformers' own GGUF tokenizer converters.
"""

from __future__ import annotations

import time
from pathlib import Path

import gguf
import numpy as np
import torch

from ratchet.errors import InputError, MissingInputError
from ratchet.model.config import ModelConfig
from ratchet.model.convert_hf import fused_parts, rename
from ratchet.model.dequantize import dequantize_into, huge_page_arrays
from ratchet.model.gguf_file import GGUFFile, read_gguf
from ratchet.model.gguf_tokenizer import write_tokenizer
from ratchet.model.io import inline_chat_template
from ratchet.model.layout import check_weights, expected_shapes
from ratchet.progress import Progress

# GGUF name -> engine name before fusion; `{}` is the layer index.
WEIGHT_MAP = {
    "token_embd.weight": "embed.weight",
    "blk.{}.attn_norm.weight": "layers.{}.attn_norm.weight",
    "blk.{}.attn_q.weight": "layers.{}.wq.weight",
    "blk.{}.attn_k.weight": "layers.{}.wk.weight",
    "blk.{}.attn_v.weight": "layers.{}.wv.weight",
    "blk.{}.attn_q.bias": "layers.{}.wq.bias",
    "blk.{}.attn_k.bias": "layers.{}.wk.bias",
    "blk.{}.attn_v.bias": "layers.{}.wv.bias",
    "blk.{}.attn_output.weight": "layers.{}.wo.weight",
    "blk.{}.ffn_norm.weight": "layers.{}.mlp_norm.weight",
    "blk.{}.ffn_gate.weight": "layers.{}.w_gate.weight",
    "blk.{}.ffn_up.weight": "layers.{}.w_up.weight",
    "blk.{}.ffn_down.weight": "layers.{}.w_down.weight",
    "output_norm.weight": "norm.weight",
    "output.weight": "lm_head.weight",
}

ARCHS = ("qwen2", "llama")

# Control tokens llama.cpp also ends generation on (llama-vocab.cpp), whatever eos_token_id says;
# Qwen instruct files name <|im_end|> as EOS but HF's generation_config also stops on <|endoftext|>.
END_OF_GENERATION_TEXTS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>",
                           "<|end_of_text|>", "<|end|>", "<end_of_turn>")


def convert_gguf(path: str | Path, tokenizer_out_dir: str | Path) -> tuple[ModelConfig, dict[str, np.ndarray]]:
    path = Path(path)
    if not path.is_file():
        raise MissingInputError(f"GGUF file not found: {path}")
    import concurrent.futures as cf
    import multiprocessing

    print(f"reading {path}")
    start = time.perf_counter()
    reader = open_gguf(path)
    cfg = read_gguf_config(reader, path)
    # The tokenizer from the fields already read (byte-level BPE, Qwen2's pre-tokenizer);
    # any other through transformers' conversion, which parses the metadata again, in a second
    # process while this one dequantises, tensor by tensor, each on all cores (dequantize.py).
    written = _write_own_tokenizer(reader, path, tokenizer_out_dir)
    with cf.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        tokenizer = pool.submit(write_gguf_tokenizer, path, tokenizer_out_dir) if not written else None
        weights = _engine_weights(reader, cfg, path)
        dequantised = time.perf_counter() - start
        if tokenizer is not None:
            tokenizer.result()  # its ValueError, if any, names the file
    # where the time goes, for a machine where this step is slow (the two run side by side)
    how = "ratchet's" if written else "transformers'"
    print(f"[convert_gguf] {len(reader.tensors)} tensors read and dequantised in {dequantised:.1f} s "
          f"({torch.get_num_threads()} threads); tokenizer ({how} conversion) ready at "
          f"{time.perf_counter() - start:.1f} s")
    return cfg, weights


def _write_own_tokenizer(reader: GGUFFile, path: Path, out_dir) -> bool:
    """gguf_tokenizer's files for a tokenizer it builds (True), or nothing (False)."""
    try:
        return write_tokenizer(reader.fields, out_dir)
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise InputError(f"{path}: cannot read the tokenizer metadata: {type(e).__name__}: {e}") from None


def open_gguf(path: Path) -> GGUFFile:
    """The GGUF file at `path`, or one error naming it (a directory, a wrong or empty file)."""
    try:
        return read_gguf(path)
    except Exception as e:  # ValueError on bad bytes; OSError on an unreadable file
        raise InputError(f"{path}: not a readable GGUF file (truncated or corrupt?): "
                         f"{type(e).__name__}: {e}") from None


class _Stored:
    """A GGUF tensor as rename() sees it: its shape in the engine's axis order (ggml's reversed)."""

    def __init__(self, tensor):
        self.tensor, self.shape = tensor, tuple(int(d) for d in reversed(tensor.shape))


def _engine_weights(reader: GGUFFile, cfg: ModelConfig, path: Path) -> dict[str, np.ndarray]:
    """Every engine tensor in float32, each GGUF tensor dequantised straight into its rows of
    it (q, k, v into wqkv; gate, up into w_gate_up): no concatenation copies, and a tied
    checkpoint's stored head (151,936 x 896 at 0.5B) is never dequantised."""
    parts = rename({t.name: _Stored(t) for t in reader.tensors}, WEIGHT_MAP, cfg, str(path))
    stored = {name: [parts[p] for p in fused_parts(name) or (name,)] for name in expected_shapes(cfg)}
    weights = huge_page_arrays({name: (sum(s.shape[0] for s in ss), *ss[0].shape[1:]) for name, ss in stored.items()})
    progress = Progress("convert_gguf", len(weights), unit="tensor")  # a line at most every 5 s
    for done, (name, out) in enumerate(weights.items(), 1):
        row = 0
        for s in stored[name]:
            rows = out[row:row + s.shape[0]]
            _dequantize(s.tensor, rows, path)
            if cfg.arch == "llama":
                rows[...] = _unpermute_llama(s.tensor.name, rows, cfg)
            row += s.shape[0]
        progress.update(done)
    check_weights(cfg, weights, str(path))
    return weights


def _dequantize(tensor, out: np.ndarray, path: Path) -> None:
    try:
        dequantize_into(np.asarray(tensor.data), tensor.tensor_type, out)
    except Exception as e:
        raise InputError(f"{path}: cannot read tensor {tensor.name!r} "
                         f"({tensor.tensor_type.name}, shape {out.shape}): {type(e).__name__}: {e}") from None


def _unpermute_llama(name: str, w: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    """Undo llama.cpp's `LlamaModel.permute` of attn_q / attn_k (weights and biases)."""
    if ".attn_q." in name:
        heads = cfg.num_heads
    elif ".attn_k." in name:
        heads = cfg.num_kv_heads
    else:
        return w
    rows = w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:])  # [heads, hd/2, 2, ...]
    return np.ascontiguousarray(rows.swapaxes(1, 2).reshape(w.shape))


def _metadata(reader: GGUFFile) -> dict:
    """Scalar and string fields as Python values; arrays (the vocabulary) as their length."""
    return {key: len(value) if reader.types[key] == gguf.GGUFValueType.ARRAY else value
            for key, value in reader.fields.items()}


def check_gguf_architecture(path: str | Path) -> str:
    """The file's architecture, refused unless supported; reads the header only (the tensors
    are memory-mapped, not read), so a wrong file fails before it is hashed or dequantised."""
    path = Path(path)
    arch = open_gguf(path).fields.get("general.architecture")
    if arch not in ARCHS:
        raise InputError(f"{path}: unsupported architecture {arch!r} (supported: {', '.join(ARCHS)})")
    return arch


def read_gguf_config(reader: GGUFFile, path: Path) -> ModelConfig:
    meta = _metadata(reader)
    arch = meta.get("general.architecture")
    if arch not in ARCHS:
        raise InputError(f"{path}: unsupported architecture {arch!r} (supported: {', '.join(ARCHS)})")
    names = {t.name for t in reader.tensors}
    if "rope_freqs.weight" in names:
        raise InputError(f"{path}: rope_freqs.weight (Llama-3 RoPE scaling baked into a table) is not "
                         "supported; convert the HF checkpoint instead")
    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling != "none":
        raise InputError(f"{path}: RoPE scaling {scaling!r} is not supported")

    def key(name, default=None):
        value = meta.get(f"{arch}.{name}", default)
        if value is None:
            raise InputError(f"{path}: missing metadata {arch}.{name}")
        return value

    hidden, heads = int(key("embedding_length")), int(key("attention.head_count"))
    embed = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    vocab = meta.get(f"{arch}.vocab_size") or (int(embed.shape[1]) if embed is not None
                                               else meta.get("tokenizer.ggml.tokens"))
    return ModelConfig(
        arch=arch,
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(key("feed_forward_length")),
        num_layers=int(key("block_count")),
        num_heads=heads,
        num_kv_heads=int(key("attention.head_count_kv", heads)),
        head_dim=int(key("attention.key_length", hidden // heads)),
        rope_theta=float(key("rope.freq_base", 10000.0)),
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
        # llama.cpp writes output.weight only when the head is not the embedding
        tie_word_embeddings="output.weight" not in names,
        qkv_bias="blk.0.attn_q.bias" in names,
        max_position_embeddings=int(key("context_length", 32768)),
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=_eos_ids(reader, meta),
        pad_token_id=meta.get("tokenizer.ggml.padding_token_id"),
    )


def _eos_ids(reader: GGUFFile, meta: dict) -> list[int]:
    ids = [int(meta[k]) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                                  "tokenizer.ggml.eom_token_id") if meta.get(k) is not None]
    tokens, types = reader.fields.get("tokenizer.ggml.tokens"), reader.fields.get("tokenizer.ggml.token_type")
    if tokens is not None and types is not None:
        control = int(gguf.TokenType.CONTROL)
        for i in np.flatnonzero(np.asarray(types) == control):
            if tokens[i] in END_OF_GENERATION_TEXTS and int(i) not in ids:
                ids.append(int(i))
    return ids


def write_gguf_tokenizer(path: Path, out_dir: str | Path) -> None:
    """tokenizer.json + tokenizer_config.json (with chat_template) rebuilt from GGUF metadata."""
    try:
        tokenizer = _gguf_tokenizer(path)
    except Exception as e:
        raise InputError(f"{path}: cannot read the tokenizer metadata: {type(e).__name__}: {e}") from None
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out_dir)
    inline_chat_template(out_dir)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        print(f"wrote {out_dir / name}")


def _gguf_tokenizer(path: Path):
    """transformers' own GGUF tokenizer conversion. Its internal helpers (which skip a second
    parse of the metadata) moved between 5.x releases; the public `from_pretrained(gguf_file=)`
    is the fallback that every release has."""
    try:
        from transformers import PreTrainedTokenizerFast
        from transformers.integrations.gguf import (
            convert_gguf_tokenizer,
            get_gguf_tokenizer,
        )
    except ImportError:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    arch, tokenizer_dict, tokenizer_config = get_gguf_tokenizer(str(path))
    backend, extra = convert_gguf_tokenizer(arch, tokenizer_dict)
    tokenizer_config = {k: v for k, v in (tokenizer_config | extra).items() if v is not None}
    return PreTrainedTokenizerFast(tokenizer_object=backend, **tokenizer_config)
