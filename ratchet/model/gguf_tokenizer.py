"""A GGUF file's tokenizer as `tokenizer.json` and `tokenizer_config.json`, built from the fields
ratchet's reader has already parsed. The study's models use byte-level BPE with Qwen2's
pre-tokenizer; for those this writes what transformers' own GGUF conversion writes (the tests
compare the two), in a second instead of a spawned process that imports transformers and torch
and parses the file again (that process was the convert stage's longest part on the GPU
machine's host: 43 s of 56 at 1.5B). Other tokenizers return False, and the caller converts
them with transformers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ratchet.atomic import write_json, write_text

# Qwen2's split (llama.cpp's pre-tokenizer "qwen2"): single digits, unlike Llama 3's \p{N}{1,3}
PRE_TOKENIZER_SPLITS = {
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+",
}
CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types
SPECIAL_TOKEN_IDS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "unk_token": "unknown_token_id",
                     "pad_token": "padding_token_id"}


def supported(fields: dict) -> bool:
    """Byte-level BPE (`tokenizer.ggml.model` gpt2) with its merges and a known pre-tokenizer."""
    return (fields.get("tokenizer.ggml.model") == "gpt2" and "tokenizer.ggml.merges" in fields
            and fields.get("tokenizer.ggml.pre") in PRE_TOKENIZER_SPLITS)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable spelling of each byte (the byte-level BPE alphabet); transformers has
    the same table, but importing it would cost the seconds this module saves (a test compares
    the two)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def tokenizer_json(fields: dict) -> dict:
    """tokenizer.json (the `tokenizers` library's format) of a supported file."""
    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    tokens = list(fields["tokenizer.ggml.tokens"])
    types = np.asarray(fields.get("tokenizer.ggml.token_type", np.zeros(len(tokens))))
    vocab = {}
    for index, token in enumerate(tokens):  # a token outside the alphabet is respelled byte by byte
        vocab[token if set(token) <= alphabet else "".join(spelling[b] for b in token.encode("utf-8"))] = index
    added = []
    for index in np.flatnonzero((types == CONTROL) | (types == USER_DEFINED)):
        token, special = tokens[index], bool(types[index] == CONTROL)
        if (special and not set(token) <= alphabet) or (not special and token not in vocab):
            continue  # as transformers: a mislabelled control token would grow the vocabulary
        added.append({"id": int(index), "content": token, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": special})
    split = {"type": "Split", "pattern": {"Regex": PRE_TOKENIZER_SPLITS[fields["tokenizer.ggml.pre"]]},
             "behavior": "Isolated", "invert": False}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [split, byte_level]},
        "post_processor": {"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {}},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [merge.split(" ") for merge in fields["tokenizer.ggml.merges"]]},
    }


def tokenizer_config(fields: dict) -> dict:
    """The special tokens by name and the chat template, as transformers' GGUF loading reads them."""
    tokens = fields["tokenizer.ggml.tokens"]
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": int(1e30),
              "add_bos_token": bool(fields.get("tokenizer.ggml.add_bos_token", False))}
    for name, key in SPECIAL_TOKEN_IDS.items():
        token_id = fields.get(f"tokenizer.ggml.{key}")
        if token_id is not None:
            config[name] = tokens[int(token_id)]
    if fields.get("tokenizer.chat_template") is not None:
        config["chat_template"] = fields["tokenizer.chat_template"]
    return config


def write_tokenizer(fields: dict, out_dir: str | Path) -> bool:
    """Write both files for a supported file (True); False, writing nothing, otherwise."""
    if not supported(fields):
        return False
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_text(out_dir / "tokenizer.json", json.dumps(tokenizer_json(fields), ensure_ascii=False) + "\n")
    write_json(out_dir / "tokenizer_config.json", tokenizer_config(fields))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        print(f"wrote {out_dir / name}")
    return True
