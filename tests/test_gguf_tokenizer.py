"""ratchet's own GGUF tokenizer files against transformers' GGUF conversion of the same file:
the same tokenizer.json, the same special tokens and chat template; a tokenizer it does not
build goes through transformers'."""

from __future__ import annotations

import json

import pytest
from test_gguf import CHAT_TEMPLATE, write_gguf
from transformers import PreTrainedTokenizerFast

from ratchet.data.tokenizer import load_tokenizer
from ratchet.model.convert_gguf import convert_gguf, write_gguf_tokenizer
from ratchet.model.gguf_file import read_gguf
from ratchet.model.gguf_tokenizer import bytes_to_unicode, supported, write_tokenizer

SAMPLES = ["the hell wall", "  two  spaces\n\n\tand tabs 123456", "ünïcödé 数字 <|im_start|>user\nhi<|im_end|>"]


def both(path, tmp_path):
    """(ratchet's directory, transformers' directory) for one GGUF file."""
    ours, ref = tmp_path / "ours", tmp_path / "ref"
    assert write_tokenizer(read_gguf(path).fields, ours)
    write_gguf_tokenizer(path, ref)
    return ours, ref


def assert_same_tokenizer(ours, ref):
    assert json.loads((ours / "tokenizer.json").read_text()) == json.loads((ref / "tokenizer.json").read_text())
    mine, theirs = (json.loads((d / "tokenizer_config.json").read_text()) for d in (ours, ref))
    for key in ("bos_token", "eos_token", "pad_token", "unk_token", "chat_template"):
        assert mine.get(key) == theirs.get(key), key
    a, b = load_tokenizer(ours), load_tokenizer(ref)
    assert (a.eos_ids, a.pad_id) == (b.eos_ids, b.pad_id)
    hf_a, hf_b = PreTrainedTokenizerFast.from_pretrained(ours), PreTrainedTokenizerFast.from_pretrained(ref)
    for text in SAMPLES:
        assert hf_a.encode(text) == hf_b.encode(text)
        assert hf_a.decode(hf_a.encode(text)) == text


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_tiny_gguf_tokenizer_is_transformers_conversion(tmp_path, arch):
    path = tmp_path / "tiny.gguf"
    write_gguf(path, arch)
    ours, ref = both(path, tmp_path)
    assert_same_tokenizer(ours, ref)
    assert json.loads((ours / "tokenizer_config.json").read_text())["chat_template"] == CHAT_TEMPLATE


def test_real_gguf_tokenizer_is_transformers_conversion(real_gguf, tmp_path):
    ours, ref = both(real_gguf, tmp_path)
    assert_same_tokenizer(ours, ref)


def test_a_tokenizer_it_does_not_build_goes_through_transformers(tmp_path, monkeypatch):
    path = tmp_path / "tiny.gguf"
    write_gguf(path, "qwen2")
    fields = dict(read_gguf(path).fields)
    assert supported(fields)
    for key, value in (("tokenizer.ggml.pre", "llama-bpe"), ("tokenizer.ggml.model", "llama")):
        assert not supported({**fields, key: value})
        assert not write_tokenizer({**fields, key: value}, tmp_path / "none")
    assert not (tmp_path / "none").exists()

    from ratchet.model import convert_gguf as module

    calls = []
    monkeypatch.setattr(module, "write_tokenizer", lambda fields, out: calls.append(out) or False)
    convert_gguf(path, tmp_path / "fallback")  # transformers' conversion writes the files
    assert calls and (tmp_path / "fallback" / "tokenizer.json").is_file()
    assert load_tokenizer(tmp_path / "fallback").eos_ids == load_tokenizer(both(path, tmp_path)[0]).eos_ids


def test_the_byte_alphabet_is_transformers():
    from transformers.convert_slow_tokenizer import bytes_to_unicode as theirs

    assert bytes_to_unicode() == theirs()
