"""GGUF -> engine weights + tokenizer: hand-written tiny files, a truncated one, and the real
Qwen2.5-Coder-0.5B-Instruct GGUF checked against transformers' own GGUF loader."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from full_logits import full_logits
from gguf import GGMLQuantizationType as Q
from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import bytes_to_unicode

from dev.hf_eval import hf_model_from_gguf
from ratchet.model.convert_gguf import convert_gguf
from ratchet.trainer.policy import Policy

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ w", "l l", "he ll"]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
D, F, H, K, HD, LAYERS = 64, 96, 4, 2, 16, 2


def vocabulary() -> tuple[list[str], list[int]]:
    """A byte-level BPE vocabulary: the 256 byte symbols, the merge results, then the specials."""
    tokens = list(bytes_to_unicode().values()) + [m.replace(" ", "") for m in MERGES] + SPECIALS
    types = [gguf.TokenType.NORMAL] * (len(tokens) - len(SPECIALS)) + [gguf.TokenType.CONTROL] * len(SPECIALS)
    return tokens, [int(t) for t in types]


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf `LlamaModel.permute`, applied to llama Q/K when writing."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path: Path, arch: str, seed: int = 0) -> dict[str, np.ndarray]:
    """A tiny model in GGUF, a mix of F32, F16 and Q8_0 tensors. Returns the values as stored
    (dequantised, un-permuted) under the GGUF names, which is what the converter must recover."""
    tokens, types = vocabulary()
    vocab = len(tokens)
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(D)
    writer.add_feed_forward_length(F)
    writer.add_head_count(H)
    writer.add_head_count_kv(K)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    if arch == "llama":
        writer.add_rope_dimension_count(HD)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_pad_token_id(tokens.index("<|endoftext|>"))
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    shapes = {"token_embd.weight": (vocab, D), "output_norm.weight": (D,), "output.weight": (vocab, D)}
    for i in range(LAYERS):
        shapes |= {f"blk.{i}.attn_norm.weight": (D,), f"blk.{i}.attn_q.weight": (H * HD, D),
                   f"blk.{i}.attn_k.weight": (K * HD, D), f"blk.{i}.attn_v.weight": (K * HD, D),
                   f"blk.{i}.attn_output.weight": (D, H * HD), f"blk.{i}.ffn_norm.weight": (D,),
                   f"blk.{i}.ffn_gate.weight": (F, D), f"blk.{i}.ffn_up.weight": (F, D),
                   f"blk.{i}.ffn_down.weight": (D, F)}
        if arch == "qwen2":
            shapes |= {f"blk.{i}.attn_q.bias": (H * HD,), f"blk.{i}.attn_k.bias": (K * HD,),
                       f"blk.{i}.attn_v.bias": (K * HD,)}
    stored = {}
    for name, shape in shapes.items():
        noise = rng.standard_normal(shape).astype(np.float32)
        value = 1 + 0.1 * noise if "norm" in name else 0.3 * noise
        if name.endswith("ffn_up.weight"):  # llama.cpp's common 8-bit quantisation
            data = gguf.quants.quantize(value, Q.Q8_0)
            stored[name] = gguf.quants.dequantize(data, Q.Q8_0)
            assert not np.array_equal(stored[name], value)
            raw_dtype = Q.Q8_0
        elif name.endswith(("attn_output.weight", "ffn_down.weight")):
            data = value.astype(np.float16)
            stored[name] = data.astype(np.float32)
            raw_dtype = None
        else:
            data = stored[name] = value
            raw_dtype = None
        if arch == "llama" and (".attn_q." in name or ".attn_k." in name):
            data = llama_cpp_permute(data, H if ".attn_q." in name else K)
        writer.add_tensor(name, data, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return stored


def relative_diff(ours: torch.Tensor, ref: torch.Tensor) -> float:
    diff = ((ours - ref).abs().max() / ref.abs().max()).item()
    print(f"max |diff| / max |ref| = {diff:.2e}, mean |diff| = {(ours - ref).abs().mean():.2e}")
    return diff


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_tiny_gguf_weights_and_logits(tmp_path, arch):
    path = tmp_path / "tiny.gguf"
    stored = write_gguf(path, arch)
    cfg, weights = convert_gguf(path, tmp_path / "tok")
    assert (cfg.arch, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (arch, LAYERS, H, K, HD)
    assert cfg.qkv_bias == (arch == "qwen2") and not cfg.tie_word_embeddings
    tokens, _ = vocabulary()
    assert cfg.vocab_size == len(tokens) and cfg.bos_token_id == tokens.index("<|endoftext|>")
    assert cfg.eos_token_ids == [tokens.index("<|im_end|>"), tokens.index("<|endoftext|>")]

    # the weights are what was written: dequantised, un-permuted, fused
    assert np.array_equal(weights["embed.weight"], stored["token_embd.weight"])
    for i in range(LAYERS):
        q, k, v = (stored[f"blk.{i}.attn_{x}.weight"] for x in "qkv")
        assert np.array_equal(weights[f"layers.{i}.wqkv.weight"], np.concatenate([q, k, v]))
        gate, up = stored[f"blk.{i}.ffn_gate.weight"], stored[f"blk.{i}.ffn_up.weight"]
        assert np.array_equal(weights[f"layers.{i}.w_gate_up.weight"], np.concatenate([gate, up]))
        assert np.array_equal(weights[f"layers.{i}.w_down.weight"], stored[f"blk.{i}.ffn_down.weight"])
        if arch == "qwen2":
            biases = [stored[f"blk.{i}.attn_{x}.bias"] for x in "qkv"]
            assert np.array_equal(weights[f"layers.{i}.wqkv.bias"], np.concatenate(biases))

    ids = torch.randint(0, cfg.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = full_logits(Policy.from_weights(cfg, weights), ids)
        ref = hf_model_from_gguf(path)(ids).logits
    assert relative_diff(ours, ref) <= 1e-5


def test_tiny_gguf_tokenizer_round_trips(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_gguf(path, "qwen2")
    convert_gguf(path, tmp_path / "tok")
    config = json.loads((tmp_path / "tok" / "tokenizer_config.json").read_text())
    assert config["chat_template"] == CHAT_TEMPLATE and config["eos_token"] == "<|im_end|>"
    ours = PreTrainedTokenizerFast.from_pretrained(tmp_path / "tok")
    ref = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    messages = [{"role": "user", "content": "hello there, the winner is in the water"}]
    text = ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = ours.encode(text)
    assert ids == ref.encode(text)
    assert ids[0] == vocabulary()[0].index("<|im_start|>")  # specials stay whole, no BOS added
    assert ours.decode(ids) == text
    assert ours.encode(" the") == [vocabulary()[0].index("Ġthe")]


def test_truncated_gguf_raises_one_clear_error(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_gguf(path, "qwen2")
    data = path.read_bytes()
    for keep in (len(data) - 1000, len(data) // 2, 100, 3):
        cut = tmp_path / f"cut{keep}.gguf"
        cut.write_bytes(data[:keep])
        with pytest.raises(ValueError, match=re.escape(str(cut))):
            convert_gguf(cut, tmp_path / "tok")
    with pytest.raises(FileNotFoundError, match="nowhere.gguf"):
        convert_gguf(tmp_path / "nowhere.gguf", tmp_path / "tok")


@pytest.fixture
def parse_each_gguf_once(monkeypatch):
    """GGUFReader spends ~10 s on the real file's 300k vocabulary strings, and our converter,
    AutoConfig and transformers' tensor loader would each parse it: share one parse."""
    cache, parse = {}, gguf.GGUFReader

    def cached(path, mode="r"):
        key = (str(Path(path).resolve()), mode)
        if key not in cache:
            cache[key] = parse(path, mode)
        return cache[key]

    monkeypatch.setattr(gguf, "GGUFReader", cached)


def test_real_qwen_gguf_matches_transformers(real_gguf, tmp_path, parse_each_gguf_once):
    start = time.time()
    cfg, weights = convert_gguf(real_gguf, tmp_path / "tok")
    assert (cfg.arch, cfg.num_layers, cfg.hidden_size, cfg.vocab_size) == ("qwen2", 24, 896, 151936)
    assert set(cfg.eos_token_ids) == {151645, 151643}  # <|im_end|>, <|endoftext|>
    policy = Policy.from_weights(cfg, weights)
    del weights
    print(f"converted in {time.time() - start:.1f} s")

    hf_config = AutoConfig.from_pretrained(real_gguf.parent, gguf_file=real_gguf.name)
    ours = PreTrainedTokenizerFast.from_pretrained(tmp_path / "tok")
    # tokenizer_type: the class AutoTokenizer would pick from this config, without parsing it again
    ref_tok = AutoTokenizer.from_pretrained(real_gguf.parent, gguf_file=real_gguf.name,
                                            tokenizer_type=hf_config.model_type)
    messages = [{"role": "user", "content": "Write fib(n) in Python."}]
    text = ref_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == text
    ids = ref_tok.encode(text)
    assert ours.encode(text) == ids
    for sample in ("def f(x):\n    return x  # ünïcödé 数字 123456", "  two  spaces\n\n\tand tabs"):
        assert ours.encode(sample) == ref_tok.encode(sample)
        assert ours.decode(ours.encode(sample)) == sample

    ids = torch.tensor([ids[:16]])
    with torch.no_grad():
        ours_logits = full_logits(policy, ids)
        del policy
        ref = hf_model_from_gguf(real_gguf, hf_config)
        ref_logits = ref(ids).logits
    assert relative_diff(ours_logits, ref_logits) <= 1e-5
    assert torch.equal(ours_logits[0, -1].argmax(), ref_logits[0, -1].argmax())
    print(f"total {time.time() - start:.1f} s")


@pytest.mark.slow
def test_real_coder15_gguf_matches_transformers(real_gguf_15, tmp_path, parse_each_gguf_once):
    """Qwen2.5-Coder-1.5B (Q4_K / Q6_K, untied head, head_dim 128, 6 query heads a kv head):
    our conversion's logits against transformers' own GGUF loading of the same file."""
    cfg, weights = convert_gguf(real_gguf_15, tmp_path / "tok")
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (28, 1536, 12, 2, 128)
    assert not cfg.tie_word_embeddings and "lm_head.weight" in weights
    policy = Policy.from_weights(cfg, weights)
    del weights
    hf_config = AutoConfig.from_pretrained(real_gguf_15.parent, gguf_file=real_gguf_15.name)
    ref_tok = AutoTokenizer.from_pretrained(real_gguf_15.parent, gguf_file=real_gguf_15.name,
                                            tokenizer_type=hf_config.model_type)
    text = ref_tok.apply_chat_template([{"role": "user", "content": "What is 17 * 23?"}], tokenize=False,
                                       add_generation_prompt=True)
    assert PreTrainedTokenizerFast.from_pretrained(tmp_path / "tok").encode(text) == ref_tok.encode(text)
    ids = torch.tensor([ref_tok.encode(text)[:24]])
    with torch.no_grad():
        ours_logits = full_logits(policy, ids)
        del policy
        ref_logits = hf_model_from_gguf(real_gguf_15, hf_config)(ids).logits
    assert relative_diff(ours_logits, ref_logits) <= 1e-5
    assert torch.equal(ours_logits[0].argmax(-1), ref_logits[0].argmax(-1))


@pytest.mark.slow
def test_real_coder15_greedy_on_the_numpy_engine_is_transformers_greedy(real_gguf_15, tmp_path, parse_each_gguf_once):
    """The engine at the 1.5B shapes (fp32, the NumPy reference) writes transformers' own
    greedy continuation of two GSM8K-style chat prompts, token for token (a spot check on the
    CPU; the full eval against `generate` is the GPU's, issue 20)."""
    from types import SimpleNamespace

    from ratchet.engine.engine import Engine
    from ratchet.engine.request import Request

    cfg, weights = convert_gguf(real_gguf_15, tmp_path / "tok")
    tok = PreTrainedTokenizerFast.from_pretrained(tmp_path / "tok")
    questions = ["Tom has 3 boxes of 12 pencils and gives away 7. How many are left?",
                 "A train travels 60 km per hour for 2.5 hours. How far does it go?"]
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                                  add_generation_prompt=True)) for q in questions]
    new = 24
    engine = Engine(SimpleNamespace(cfg=cfg, weights=weights, dtype="fp32"), backend="numpy",
                    max_batch_size=2, max_seq_len=max(map(len, prompts)) + new + 1)
    ours = engine.generate([Request(request_id=i, prompt=p, max_new_tokens=new, greedy=True, seed=0)
                            for i, p in enumerate(prompts)])
    del engine, weights
    hf = hf_model_from_gguf(real_gguf_15)
    for prompt, req in zip(prompts, ours):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False)[0, len(prompt):]
        ref = ref.tolist()
        n = len(req.output)
        assert req.output == ref[:n], (tok.decode(req.output), tok.decode(ref))
        assert n == len(ref) or ref[n - 1] in cfg.eos_token_ids  # stopped at eos, as generate did
        print(tok.decode(req.output))
