"""llama.cpp GGUF file (qwen2 or llama) -> (ModelConfig, engine weights) and a tokenizer directory.

The header is read by ratchet/model/gguf_file.py; tensors are dequantised to float32 by the
`gguf` package (any ggml type it knows).
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

from ratchet.errors import InputError, MissingInputError
from ratchet.model.config import ModelConfig
from ratchet.model.convert_hf import fuse, rename
from ratchet.model.gguf_file import GGUFFile, read_gguf
from ratchet.model.gguf_tokenizer import write_tokenizer
from ratchet.model.io import inline_chat_template

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
    import os

    print(f"reading {path}")
    start = time.perf_counter()
    reader = _open(path)
    cfg = read_gguf_config(reader, path)
    # The tokenizer from the fields already read (byte-level BPE, Qwen2's pre-tokenizer);
    # any other through transformers' conversion, which parses the metadata again, in a second
    # process while this one dequantises, tensor by tensor on a thread pool (NumPy releases
    # the GIL).
    written = _write_own_tokenizer(reader, path, tokenizer_out_dir)
    with cf.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        tokenizer = pool.submit(write_gguf_tokenizer, path, tokenizer_out_dir) if not written else None
        workers = min(16, os.cpu_count() or 1)
        source = {t.name: _output(t) for t in reader.tensors}
        with cf.ThreadPoolExecutor(workers) as threads:
            # the large tensors (the embedding, the head) in row blocks: the pool's end waits
            # for its slowest task, which a whole 136M-value embedding would be
            list(threads.map(lambda job: _dequantize_rows(*job, source, path), _row_blocks(reader.tensors, source)))
        if cfg.arch == "llama":
            source = {name: _unpermute_llama(name, w, cfg) for name, w in source.items()}
        weights = fuse(rename(source, WEIGHT_MAP, cfg, str(path)), cfg, str(path))
        dequantised = time.perf_counter() - start
        if tokenizer is not None:
            tokenizer.result()  # its ValueError, if any, names the file
    # where the time goes, for a machine where this step is slow (the two run side by side)
    how = "ratchet's" if written else "transformers'"
    print(f"[convert_gguf] {len(reader.tensors)} tensors read and dequantised in {dequantised:.1f} s "
          f"({workers} threads); tokenizer ({how} conversion) ready at {time.perf_counter() - start:.1f} s")
    return cfg, weights


def _write_own_tokenizer(reader: GGUFFile, path: Path, out_dir) -> bool:
    """gguf_tokenizer's files for a tokenizer it builds (True), or nothing (False)."""
    try:
        return write_tokenizer(reader.fields, out_dir)
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise InputError(f"{path}: cannot read the tokenizer metadata: {type(e).__name__}: {e}") from None


def _open(path: Path) -> GGUFFile:
    try:
        return read_gguf(path)
    except Exception as e:  # ValueError on bad bytes; OSError on an unreadable file
        raise InputError(f"{path}: not a readable GGUF file (truncated or corrupt?): "
                         f"{type(e).__name__}: {e}") from None


BLOCK_VALUES = 1 << 22  # values a dequantisation task at most (whole rows; a row may exceed it)


def _output(tensor) -> np.ndarray:
    """The float32 array a tensor dequantises into, in the engine's axis order."""
    return np.empty(tuple(int(d) for d in reversed(tensor.shape)), dtype=np.float32)


def _row_blocks(tensors, out: dict) -> list[tuple]:
    """(tensor, first row, end row) tasks, rows None for a tensor dequantised whole: a tensor's
    quantisation blocks never cross its rows (ggml quantises along the fastest axis), so any
    rows dequantise alone, to the same values. `out`: each tensor's output array (_output)."""
    jobs = []
    for t in tensors:
        shape = out[t.name].shape
        if len(shape) < 2 or np.asarray(t.data).shape[0] != shape[0]:
            jobs.append((t, None, None))
            continue
        step = max(1, BLOCK_VALUES // (int(np.prod(shape)) // shape[0] or 1))
        jobs += [(t, r, min(r + step, shape[0])) for r in range(0, shape[0], step)]
    return jobs


def _dequantize_rows(tensor, start: int | None, end: int | None, out: dict, path: Path) -> None:
    """Rows [start, end) of `tensor` into out[tensor.name] (all of it where they are None)."""
    target = out[tensor.name]
    try:
        # a plain ndarray view: slicing the reader's np.memmap costs a third more time
        data = np.asarray(tensor.data)
        if start is not None:
            data, target = data[start:end], target[start:end]
        target[...] = gguf.quants.dequantize(data, tensor.tensor_type).reshape(target.shape)
    except Exception as e:
        raise InputError(f"{path}: cannot read tensor {tensor.name!r} "
                         f"({tensor.tensor_type.name}, shape {tuple(out[tensor.name].shape)}): "
                         f"{type(e).__name__}: {e}") from None


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
    arch = _open(path).fields.get("general.architecture")
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
