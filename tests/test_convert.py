"""HF checkpoint -> engine model dir -> Policy, checked against transformers' own forward pass."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from full_logits import full_logits

from ratchet.model import safetensors_io
from ratchet.model.convert_hf import convert_hf
from ratchet.model.dtypes import round_to
from ratchet.model.io import load_engine_model, save_engine_model
from ratchet.model.layout import expected_shapes
from ratchet.model.tiny import make_tiny_model
from ratchet.trainer.policy import Policy

SMALL = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Random values everywhere (HF's init leaves biases at 0 and norms at 1, hiding mistakes)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn_like(p)
            p.copy_(1 + 0.1 * noise if "norm" in name else 0.2 * noise)


def engine_policy(src_dir, tmp_path, dtype="fp32") -> Policy:
    cfg, weights = convert_hf(src_dir)
    out = save_engine_model(tmp_path / "engine", cfg, weights, dtype)
    em = load_engine_model(out)
    return Policy.from_weights(em.cfg, em.weights)


def relative_diff(ours: torch.Tensor, ref: torch.Tensor) -> float:
    diff = ((ours - ref).abs().max() / ref.abs().max()).item()
    print(f"max |diff| / max |ref| = {diff:.2e}, mean |diff| = {(ours - ref).abs().mean():.2e}")
    return diff


def compare_logits(policy: Policy, hf_model, vocab: int, length: int, seed: int = 0) -> float:
    ids = torch.randint(0, vocab, (2, length), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return relative_diff(full_logits(policy, ids), hf_model(ids).logits)


def test_qwen2_gqa_biases_untied_matches_hf(tmp_path):
    hf_cfg = Qwen2Config(**SMALL, tie_word_embeddings=False, rope_theta=1e6)
    model = Qwen2ForCausalLM(hf_cfg).eval()
    randomize(model, 0)
    model.save_pretrained(tmp_path / "hf")
    policy = engine_policy(tmp_path / "hf", tmp_path)
    assert policy.cfg.qkv_bias and not policy.cfg.tie_word_embeddings
    assert set(policy.state_dict()) == set(expected_shapes(policy.cfg))
    assert compare_logits(policy, model, SMALL["vocab_size"], 40) <= 1e-5


def test_qwen2_tied_bf16_matches_hf(tmp_path):
    hf_cfg = Qwen2Config(**SMALL, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(hf_cfg).eval()
    randomize(model, 1)
    model.to(torch.bfloat16).save_pretrained(tmp_path / "hf")
    cfg, weights = convert_hf(tmp_path / "hf")
    assert cfg.tie_word_embeddings and "lm_head.weight" not in weights
    assert all(np.array_equal(w, round_to(w, "bf16")) for w in weights.values())
    # the reference: the stored bf16 weights, upcast to fp32
    ref = Qwen2ForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    policy = engine_policy(tmp_path / "hf", tmp_path, dtype="bf16")
    assert compare_logits(policy, ref, SMALL["vocab_size"], 40) <= 1e-5


def test_llama3_rope_scaling_matches_hf(tmp_path):
    # head_dim 16 gives wavelengths on both sides of, and inside, the [8, 32] smoothing band
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    hf_cfg = LlamaConfig(**(SMALL | {"hidden_size": 64}), rope_scaling=dict(scaling), rope_theta=10000.0)
    model = LlamaForCausalLM(hf_cfg).eval()
    randomize(model, 2)
    model.save_pretrained(tmp_path / "hf")
    policy = engine_policy(tmp_path / "hf", tmp_path)
    assert policy.cfg.rope_scaling == scaling and not policy.cfg.qkv_bias
    assert compare_logits(policy, model, SMALL["vocab_size"], 96) <= 1e-5
    # and the scaling matters at these positions: without it the logits move
    unscaled = Policy(policy.cfg.__class__(**(policy.cfg.to_dict() | {"rope_scaling": None})))
    unscaled.load_weights(policy.export_weights())
    assert compare_logits(unscaled, model, SMALL["vocab_size"], 96) > 1e-3


def test_sharded_checkpoint_and_generation_eos(tmp_path):
    model = Qwen2ForCausalLM(Qwen2Config(**SMALL, eos_token_id=5)).eval()
    randomize(model, 3)
    model.save_pretrained(tmp_path / "one")
    model.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    (tmp_path / "sharded" / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 5]}))
    cfg_one, one = convert_hf(tmp_path / "one")
    cfg_sharded, sharded = convert_hf(tmp_path / "sharded")
    assert cfg_one.eos_token_ids == [5] and cfg_sharded.eos_token_ids == [5, 7]
    assert one.keys() == sharded.keys()
    assert all(np.array_equal(one[n], sharded[n]) for n in one)


def test_tiny_model_is_deterministic_and_matches_hf(tmp_path):
    kwargs = dict(seed=7, vocab_size=40, hidden_size=32, intermediate_size=64, num_layers=2,
                  num_heads=4, num_kv_heads=2, eos_token_id=3)
    a = make_tiny_model(tmp_path / "a", **kwargs)
    b = make_tiny_model(tmp_path / "b", **kwargs)
    c = make_tiny_model(tmp_path / "c", **(kwargs | {"seed": 8}))
    for name in ("config.json", "model.safetensors"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()
    ref = Qwen2ForCausalLM.from_pretrained(a, dtype=torch.float32).eval()
    policy = engine_policy(a, tmp_path)
    assert policy.cfg.tie_word_embeddings and policy.cfg.eos_token_ids == [3]
    assert compare_logits(policy, ref, 40, 24) <= 1e-5


# ---------------------------------------------------------------- engine model directory
def random_weights(cfg, seed=0):
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in expected_shapes(cfg).items()}


@pytest.fixture
def tiny_cfg(tmp_path):
    make_tiny_model(tmp_path / "hf", vocab_size=40, hidden_size=32, intermediate_size=64)
    return convert_hf(tmp_path / "hf")[0]


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_round_trip_storage_equals_round_to(tmp_path, tiny_cfg, dtype):
    weights = random_weights(tiny_cfg)
    out = save_engine_model(tmp_path / "m", tiny_cfg, weights, dtype)
    header, _ = safetensors_io.read_header(out / "model.safetensors")
    assert {info["dtype"] for info in header.values()} == {{"fp32": "F32", "fp16": "F16", "bf16": "BF16"}[dtype]}
    em = load_engine_model(out)
    assert em.dtype == dtype and em.cfg == tiny_cfg
    for name, w in weights.items():
        assert em.weights[name].dtype == np.float32
        assert np.array_equal(em.weights[name], round_to(w, dtype)), name


def test_manifest_hashes_match_file(tmp_path, tiny_cfg):
    out = save_engine_model(tmp_path / "m", tiny_cfg, random_weights(tiny_cfg), "bf16")
    manifest = json.loads((out / "manifest.json").read_text())
    data = (out / "model.safetensors").read_bytes()
    assert manifest["file_sha256"] == hashlib.sha256(data).hexdigest()
    assert manifest["dtype"] == "bf16"
    assert manifest["num_parameters"] == sum(int(np.prod(s)) for s in expected_shapes(tiny_cfg).values())
    header, start = safetensors_io.read_header(out / "model.safetensors")
    for name, info in header.items():
        a, b = info["data_offsets"]
        assert manifest["tensors"][name]["sha256"] == hashlib.sha256(data[start + a:start + b]).hexdigest()
        assert manifest["tensors"][name]["shape"] == info["shape"]
    assert json.loads((out / "config.json").read_text())["engine_dtype"] == "bf16"


def test_save_replaces_existing_dir_and_copies_tokenizer(tmp_path, tiny_cfg):
    tok = tmp_path / "tok"
    tok.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "config.json"):
        (tok / name).write_text("{}")
    (tok / "model.safetensors").write_bytes(b"not a tokenizer")
    (tok / "chat_template.jinja").write_text("{{ messages }}")  # where transformers 5 saves it
    out = tmp_path / "m"
    save_engine_model(out, tiny_cfg, random_weights(tiny_cfg, 0), "fp32")
    (out / "stale.txt").write_text("from the previous save")
    for killed in (".m.tmp-4307", ".m.old-4308"):  # a killed writer's copies (a whole model each)
        (tmp_path / killed).mkdir()
    (tmp_path / ".m.tmp-notes").mkdir()  # not one of ours: left
    (tmp_path / ".other.tmp-1").mkdir()
    save_engine_model(out, tiny_cfg, random_weights(tiny_cfg, 1), "fp16", tokenizer_dir=tok)
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json", "manifest.json", "model.safetensors", "special_tokens_map.json",
        "tokenizer.json", "tokenizer_config.json"]
    assert json.loads((out / "config.json").read_text())["engine_dtype"] == "fp16"
    assert json.loads((out / "tokenizer_config.json").read_text()) == {"chat_template": "{{ messages }}"}
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == [
        ".m.tmp-notes", ".other.tmp-1"]  # no temporary of this model's left


# ---------------------------------------------------------------- clear errors
def test_convert_errors_name_the_culprit(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        convert_hf(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        convert_hf(tmp_path / "empty")

    src = make_tiny_model(tmp_path / "hf", vocab_size=40, hidden_size=32, intermediate_size=64)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps(config | {"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match="unsupported architecture 'GPT2LMHeadModel'"):
        convert_hf(src)
    (src / "config.json").write_text(json.dumps(config))

    tensors = safetensors_io.load_fp32(src / "model.safetensors")
    name = "model.layers.1.self_attn.k_proj.weight"
    safetensors_io.save(src / "model.safetensors", {k: v for k, v in tensors.items() if k != name}, "fp32")
    with pytest.raises(ValueError, match=f"missing tensor '{name}'"):
        convert_hf(src)

    bad = tensors | {name: tensors[name][:, :-1]}
    safetensors_io.save(src / "model.safetensors", bad, "fp32")
    with pytest.raises(ValueError, match=rf"'{name}' has shape \(16, 31\), expected \(16, 32\)"):
        convert_hf(src)


def test_the_manifest_check_holds_the_header_to_the_listed_tensors(tmp_path, tiny_cfg):
    """The check hashes tensor by tensor: what the header describes around them must be the
    manifest's too (no unlisted tensor, the engine dtype's storage, no bytes past the last)."""
    weights = random_weights(tiny_cfg)
    out = save_engine_model(tmp_path / "m", tiny_cfg, weights, "fp32")
    path = out / "model.safetensors"
    original = path.read_bytes()
    load_engine_model(out)

    path.write_bytes(original + bytes(16))
    with pytest.raises(ValueError, match="16 bytes after the last tensor that manifest.json does not list"):
        load_engine_model(out)
    safetensors_io.save(path, weights | {"extra.weight": weights["norm.weight"]}, "fp32")
    with pytest.raises(ValueError, match="tensor 'extra.weight' is not listed in manifest.json"):
        load_engine_model(out)
    safetensors_io.save(path, weights, "fp16")  # the same names, packed, in another storage
    with pytest.raises(ValueError, match=r"'[\w.]+' is stored as F16, not F32 \(fp32, as config.json says\)"):
        load_engine_model(out)
    path.write_bytes(original)
    load_engine_model(out)


def test_load_engine_model_errors_name_the_culprit(tmp_path, tiny_cfg):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_engine_model(tmp_path / "nowhere")
    weights = random_weights(tiny_cfg)
    out = save_engine_model(tmp_path / "m", tiny_cfg, weights, "fp32")
    (out / "config.json").rename(tmp_path / "config.json")
    with pytest.raises(FileNotFoundError, match="missing config.json"):
        load_engine_model(out)
    (tmp_path / "config.json").rename(out / "config.json")

    # flip one byte inside one tensor: the manifest check names it
    header, start = safetensors_io.read_header(out / "model.safetensors")
    offset = start + header["layers.1.w_down.weight"]["data_offsets"][0] + 5
    data = bytearray((out / "model.safetensors").read_bytes())
    data[offset] ^= 0xFF
    (out / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="'layers.1.w_down.weight' does not match manifest.json"):
        load_engine_model(out)
    load_engine_model(out, verify=False)  # the check is optional
    (out / "manifest.json").unlink()
    with pytest.raises(FileNotFoundError, match="missing manifest.json"):
        load_engine_model(out)

    safetensors_io.save(out / "model.safetensors",
                        {k: v for k, v in weights.items() if k != "norm.weight"}, "fp32")
    with pytest.raises(ValueError, match="missing tensor 'norm.weight'"):
        load_engine_model(out, verify=False)
    safetensors_io.save(out / "model.safetensors",
                        weights | {"norm.weight": weights["norm.weight"][:-1]}, "fp32")
    with pytest.raises(ValueError, match=r"'norm.weight' has shape \(31,\), expected \(32,\)"):
        load_engine_model(out, verify=False)
    (out / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="missing model.safetensors"):
        load_engine_model(out)
