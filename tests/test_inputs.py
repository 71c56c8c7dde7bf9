"""Inputs are checked where they are cheap to check, each with one error naming the culprit."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest

from ratchet.data.gsm8k import load_gsm8k_local
from ratchet.errors import InputError, MissingInputError
from ratchet.model.convert_gguf import check_gguf_architecture
from ratchet.model.convert_hf import convert_hf, read_hf_config
from ratchet.model.tiny import make_tiny_model


@pytest.fixture
def hf_dir(tmp_path) -> Path:
    return Path(make_tiny_model(tmp_path / "hf", seed=0, vocab_size=32, hidden_size=32,
                                intermediate_size=64, num_layers=1, num_heads=4, num_kv_heads=2))


def _edit_config(model_dir: Path, drop=(), **changes) -> None:
    path = model_dir / "config.json"
    cfg = json.loads(path.read_text())
    cfg.update(changes)
    for key in drop:
        del cfg[key]
    path.write_text(json.dumps(cfg))


def test_the_tiny_model_passes(hf_dir):
    cfg, _ = convert_hf(hf_dir)
    assert cfg.arch == "qwen2"


def test_model_type_disagreeing_with_architectures_is_refused(hf_dir):
    _edit_config(hf_dir, model_type="llama")  # architectures says Qwen2ForCausalLM
    with pytest.raises(InputError, match="model_type 'llama' disagrees with architectures"):
        read_hf_config(hf_dir)


def test_hidden_size_not_divisible_by_heads_is_named(hf_dir):
    _edit_config(hf_dir, drop=["head_dim"], num_attention_heads=6)
    with pytest.raises(InputError, match="hidden_size 32 is not divisible by num_attention_heads 6"):
        read_hf_config(hf_dir)


def test_head_dim_disagreeing_with_the_weights_is_named(hf_dir):
    _edit_config(hf_dir, head_dim=16)  # the q rows are 4 heads x 8
    with pytest.raises(InputError, match=r"num_attention_heads 4 x head_dim 16 = 64 rows, but q_proj has 32"):
        convert_hf(hf_dir)


@pytest.mark.parametrize("name, text, message", [
    ("config.json", None, r"config\.json: missing key 'num_attention_heads'"),
    ("config.json", '{"vocab_size": 32,\n', r"config\.json: not valid JSON"),
    ("config.json", "[1, 2]", r"config\.json: expected a JSON object, got list"),
    ("generation_config.json", "{eos", r"generation_config\.json: not valid JSON"),
])
def test_a_broken_json_file_of_the_model_is_named(hf_dir, name, text, message):
    if text is None:
        _edit_config(hf_dir, drop=["num_attention_heads"])
    else:
        (hf_dir / name).write_text(text)
    with pytest.raises(InputError, match=message):
        read_hf_config(hf_dir)


@pytest.mark.parametrize("content", [None, b"", b"not a gguf file at all"])  # None: a directory
def test_a_model_path_that_is_no_gguf_file_is_named_before_the_pipeline_starts(tmp_path, content):
    from ratchet.preflight import estimated_parameters

    path = tmp_path
    if content is not None:
        path = tmp_path / "model.gguf"
        path.write_bytes(content)
    with pytest.raises(InputError, match=f"{path}: not a readable GGUF file"):
        estimated_parameters({"source": "gguf", "path": str(path)})


def test_unsupported_gguf_architecture_is_refused_from_the_header(tmp_path):
    path = tmp_path / "gpt2.gguf"
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(InputError, match="unsupported architecture 'gpt2'"):
        check_gguf_architecture(path)


def _gsm8k(path: Path, n: int, offset: int = 0) -> Path:
    rows = [{"question": f"What is {i} + 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"}
            for i in range(offset, offset + n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_same_file_as_train_and_test_is_refused(tmp_path):
    train = _gsm8k(tmp_path / "train.jsonl", 5)
    with pytest.raises(InputError, match="are the same file"):
        load_gsm8k_local(train, train)


def test_a_copy_of_train_as_test_is_refused(tmp_path):
    train = _gsm8k(tmp_path / "train.jsonl", 5)
    copy = _gsm8k(tmp_path / "copy.jsonl", 5)
    with pytest.raises(InputError, match="are the same file"):
        load_gsm8k_local(train, copy)


def test_distinct_splits_pass(tmp_path):
    train, test = load_gsm8k_local(_gsm8k(tmp_path / "a.jsonl", 5), _gsm8k(tmp_path / "b.jsonl", 3, 100))
    assert len(train) == 5 and len(test) == 3


def test_missing_inputs_are_input_errors_and_file_not_found(tmp_path):
    with pytest.raises(MissingInputError) as info:
        load_gsm8k_local(tmp_path / "nope.jsonl", tmp_path / "nope2.jsonl")
    assert isinstance(info.value, FileNotFoundError) and "nope.jsonl" in str(info.value)
