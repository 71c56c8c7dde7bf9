"""The ablation tests' tiny world: a seeded one-layer Qwen2 model converted to fp16, the
synthetic arithmetic task, and the Setup every ablation run starts from."""

from __future__ import annotations

from pathlib import Path

from ratchet.data.char_tokenizer import save_char_tokenizer
from ratchet.data.prompts import make_prompt_fn
from ratchet.data.synthetic import ALPHABET, make_arithmetic
from ratchet.data.tokenizer import load_tokenizer
from ratchet.mismatch.ablation import Setup
from ratchet.model.convert_hf import convert_hf
from ratchet.model.io import load_engine_model, save_engine_model
from ratchet.model.tiny import make_tiny_model
from ratchet.rl.task import Task


def tiny_setup(root: Path, num_test: int = 40, num_measure: int = 0, with_eval: bool = False,
               **model_options) -> Setup:
    """Under `root`: the model (make_tiny_model's `model_options` over the tests' small shape),
    400 training problems, `num_test` test ones, the first `num_measure` of them as the
    measurement prompts, and with `with_eval` the test split as the after-training eval."""
    save_char_tokenizer(root / "tok", ALPHABET)
    tok = load_tokenizer(root / "tok")
    shape = dict(seed=0, vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64, num_layers=1,
                 num_heads=2, num_kv_heads=1, tokenizer_dir=root / "tok", eos_token_id=tok.eos_ids[0],
                 pad_token_id=tok.pad_id)
    make_tiny_model(root / "hf", **{**shape, **model_options})
    cfg, weights = convert_hf(root / "hf")
    save_engine_model(root / "model", cfg, weights, "fp16", tokenizer_dir=root / "hf")
    model = load_engine_model(root / "model")
    tokenizer = load_tokenizer(root / "model")
    prompt_fn = make_prompt_fn(tokenizer, "synthetic")
    train, test = make_arithmetic(400, num_test, seed=0)
    task = Task([prompt_fn(q) for q in train["question"]], list(train["target"]), tokenizer)
    measure = [prompt_fn(q) for q in test["question"][:num_measure]]
    evals = dict(prompt_fn=prompt_fn, eval_problems=test, eval_max_new_tokens=2) if with_eval else {}
    return Setup(model, task, measure, backend="numpy", max_batch_size=64, max_seq_len=32, **evals)
