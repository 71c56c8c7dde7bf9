"""The Hugging Face export: transformers loads it and gives the trainer's logits; converting it
back gives the engine tensors bit for bit."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from ratchet.data.char_tokenizer import save_char_tokenizer
from ratchet.model.convert_hf import convert_hf
from ratchet.model.export_hf import export_hf
from ratchet.model.io import EngineModel
from ratchet.trainer.policy import Policy

SMALL = dict(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
ALPHABET = "0123456789+=?abcdefghijklmnopqrstuvw"  # with the specials, 40 ids


def _random_hf(model_cls, config, path, seed=0):
    model = model_cls(config).eval()
    torch.manual_seed(seed)
    with torch.no_grad():  # random biases and norms too: HF's init would hide a swapped part
        for name, p in model.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name else 0.2 * torch.randn_like(p))
    model.save_pretrained(path)
    return path


def _logits(policy: Policy, ids: torch.Tensor) -> torch.Tensor:
    return F.linear(policy.hidden_states(ids), policy.head_weight())


@pytest.mark.parametrize("arch", ["qwen2-untied", "llama-tied"])
def test_export_loads_in_transformers_with_the_trainers_logits(tmp_path, arch):
    if arch == "qwen2-untied":
        src = _random_hf(Qwen2ForCausalLM, Qwen2Config(**SMALL, tie_word_embeddings=False), tmp_path / "src")
    else:
        src = _random_hf(LlamaForCausalLM, LlamaConfig(**SMALL, tie_word_embeddings=True), tmp_path / "src")
    cfg, weights = convert_hf(src)
    tokenizer_dir = save_char_tokenizer(tmp_path / "tok", ALPHABET)
    record = export_hf(EngineModel(cfg, weights, "fp32"), tmp_path / "export", "fp32", tokenizer_dir)
    assert record["lossless"] and (tmp_path / "export" / "generation_config.json").is_file()

    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "export").eval()
    policy = Policy.from_weights(cfg, weights)
    ids = torch.randint(0, SMALL["vocab_size"], (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = _logits(policy, ids), hf(ids).logits
    rel = float((ours - theirs).abs().max() / theirs.abs().max())
    print(f"{arch}: max |logits diff| / max |logits| = {rel:.2e}")
    assert rel <= 1e-5

    again, back = convert_hf(tmp_path / "export")
    assert again == cfg
    for name, w in weights.items():
        np.testing.assert_array_equal(back[name], w, err_msg=name)
    assert AutoTokenizer.from_pretrained(tmp_path / "export").encode("1+2=", add_special_tokens=False)


def test_export_in_a_narrower_dtype_says_whether_it_rounded(tmp_path):
    src = _random_hf(Qwen2ForCausalLM, Qwen2Config(**SMALL), tmp_path / "src")
    cfg, weights = convert_hf(src)
    tok = save_char_tokenizer(tmp_path / "tok", ALPHABET)
    record = export_hf(EngineModel(cfg, weights, "fp32"), tmp_path / "bf16", "bf16", tok)
    assert not record["lossless"]  # random fp32 values are off the bf16 grid
    config = json.loads((tmp_path / "bf16" / "config.json").read_text())
    assert config["torch_dtype"] == "bfloat16"


def test_the_export_keeps_its_own_ids_and_card_and_replaces_a_killed_export(tmp_path):
    """The source's README.md (the base model's card) and generation_config.json were copied
    over the export's own; a killed export left its temporary directories for good."""
    src = _random_hf(Qwen2ForCausalLM, Qwen2Config(**SMALL), tmp_path / "src")
    cfg, weights = convert_hf(src)
    tok = save_char_tokenizer(tmp_path / "tok", ALPHABET)
    (tok / "README.md").write_text("# the base model's card\n")
    (tok / "generation_config.json").write_text(json.dumps({"eos_token_id": [99], "temperature": 0.7,
                                                            "top_p": 0.8}))
    (tmp_path / ".export.tmp-12345").mkdir()  # a killed export's leftovers
    (tmp_path / ".export.old-12346").mkdir()
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "stale.txt").write_text("an earlier export's file")
    export_hf(EngineModel(cfg, weights, "fp32"), tmp_path / "export", "fp32", tok, card="# ours\n")
    out = tmp_path / "export"
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["eos_token_id"] == (cfg.eos_token_ids or None) and generation["temperature"] == 0.7
    assert (out / "README.md").read_text() == "# ours\n" and not (out / "stale.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


@pytest.mark.slow
def test_the_export_stage_gives_the_trained_models_logits_in_transformers(tmp_path, monkeypatch):
    from ratchet.config import validate
    from ratchet.model.io import load_engine_model
    from ratchet.paths import RunPaths
    from ratchet.stages import run_stage

    monkeypatch.setenv("RATCHET_TRACKING", "off")
    cfg = validate({"results_dir": str(tmp_path / "results"), "model": {"tiny": {"init_std": 0.1}},
                    "train": {"steps": 3, "checkpoint_every": 3, "eval_every": 0}})
    for stage in ("download_model", "download_data", "convert_weights", "build_engine",
                  "train_colocated", "export_colocated"):
        run_stage(stage, cfg)
    paths = RunPaths.from_config(cfg)
    record = json.loads(paths.export_record("colocated").read_text())
    assert record["dtype"] == "fp32" and record["lossless"]  # the tiny source is fp32; fp16 values fit
    trained = load_engine_model(paths.train_model("colocated"))
    policy = Policy.from_weights(trained.cfg, trained.weights)
    hf = AutoModelForCausalLM.from_pretrained(paths.export_dir("colocated")).eval()
    ids = torch.randint(0, trained.cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ours, theirs = _logits(policy, ids), hf(ids).logits
    assert float((ours - theirs).abs().max() / theirs.abs().max()) <= 1e-5


def test_the_real_gguf_models_export_loads_in_transformers_with_the_trainers_logits(real_gguf, tmp_path):
    """Qwen2.5-Coder-0.5B-Instruct from its GGUF file, converted to the engine's fp16 as the
    pipeline does, exported (fp16: a GGUF has no dtype of ours), loaded by transformers."""
    from ratchet.model.convert_gguf import convert_gguf
    from ratchet.model.dtypes import round_to

    cfg, weights = convert_gguf(real_gguf, tmp_path / "tok")
    weights = {k: round_to(v, "fp16") for k, v in weights.items()}
    record = export_hf(EngineModel(cfg, weights, "fp16"), tmp_path / "export", "fp16", tmp_path / "tok")
    assert record["lossless"]
    policy = Policy.from_weights(cfg, weights)
    del weights
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "export")
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Write fib(n) in Python."}],
                                         tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>")
    ids = torch.tensor([tokenizer.encode(text)[:16]])
    with torch.no_grad():
        ours = _logits(policy, ids)
        del policy
        hf = AutoModelForCausalLM.from_pretrained(tmp_path / "export", dtype=torch.float32).eval()
        theirs = hf(ids).logits
    rel = float((ours - theirs).abs().max() / theirs.abs().max())
    print(f"real model export: max |logits diff| / max |logits| = {rel:.2e}")
    assert rel <= 1e-5
