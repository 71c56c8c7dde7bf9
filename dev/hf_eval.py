"""HF transformers' own greedy generation on the same prompt tokens as ratchet's eval, the
model loaded by transformers itself (never by ratchet's converter), so that a conversion bug
cannot hide in both.

    python -m dev.hf_eval --source PATH --model-dir results/local/model \
        --test results/local/data/test.parquet --out hf_eval.json [--answers baseline_answers.parquet]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd


def hf_model_from_gguf(path: Path, config=None, dtype=None):
    """transformers' own GGUF loading (the tensors `from_pretrained(gguf_file=)` reads for qwen2
    and llama, dequantised and un-permuted by transformers), without the `accelerate` package
    `from_pretrained` insists on for GGUF files."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.initialization import no_init_weights
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = config or AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False, assign=True)
    allowed = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if unexpected or not set(missing) <= allowed:
        raise ValueError(f"{path}: transformers' GGUF tensors do not fit its model "
                         f"(missing {sorted(set(missing) - allowed)}, unexpected {sorted(unexpected)})")
    model.tie_weights()
    return (model.to(dtype) if dtype is not None else model).eval()


def load_hf_model(source: Path, dtype, device: str):
    from transformers import AutoModelForCausalLM

    if source.suffix == ".gguf":
        model = hf_model_from_gguf(source, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    return model.to(device).eval()


def greedy_generate(model, prompts: list[list[int]], max_new_tokens: int, eos_ids: list[int],
                    pad_id: int, batch_size: int) -> tuple[list[list[int]], float]:
    """Greedy answers, longest prompts first in left-padded batches; returns (answers, seconds)."""
    import torch

    device = next(model.parameters()).device
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    answers: list[list[int]] = [[] for _ in prompts]
    torch.cuda.synchronize() if device.type == "cuda" else None
    t0 = time.perf_counter()
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        width = max(len(prompts[i]) for i in idx)
        ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for row, i in enumerate(idx):
            ids[row, width - len(prompts[i]):] = torch.tensor(prompts[i])
            mask[row, width - len(prompts[i]):] = 1
        with torch.no_grad():
            out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                                 do_sample=False, max_new_tokens=max_new_tokens,
                                 eos_token_id=eos_ids, pad_token_id=pad_id)
        for row, i in enumerate(idx):
            new = out[row, width:].tolist()
            cut = next((k + 1 for k, t in enumerate(new) if t in eos_ids), len(new))
            answers[i] = new[:cut]
        print(f"[hf_eval] {start + len(idx)}/{len(order)} problems, "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
    torch.cuda.synchronize() if device.type == "cuda" else None
    return answers, time.perf_counter() - t0


SAME_VERDICT_GOAL = 0.97  # issue 20: the engine and transformers agree on right or wrong this often


def compare_with_engine(engine_answers: pd.DataFrame, ids, texts: list[str], rewards: np.ndarray) -> dict:
    """The engine's eval (its answers parquet) against transformers' on the same problems: how
    often the answers are identical, how often both are right or both wrong, and the accuracy
    difference paired by problem (engine - transformers) with its standard error."""
    from ratchet.mismatch.paired import paired_difference

    missing = sorted(set(ids) - set(engine_answers["id"]))
    if missing:
        raise ValueError(f"the engine's answers lack {len(missing)} of the problems (first: {missing[0]})")
    ours = engine_answers.set_index("id").loc[list(ids)]
    engine_correct = ours["reward"].to_numpy() >= 1
    hf_correct = np.asarray(rewards) >= 1
    paired = paired_difference(hf_correct, engine_correct)
    acc = float(hf_correct.mean())
    stderr = float(np.sqrt(acc * (1 - acc) / len(hf_correct)))
    same_verdict = float(np.mean(engine_correct == hf_correct))
    return {
        "engine_accuracy": float(engine_correct.mean()),
        "identical_answers_share": float(np.mean([x == y for x, y in zip(texts, ours["response"])])),
        "same_verdict_share": same_verdict,
        "engine_minus_hf": paired,
        "accuracy_within_stderr": bool(abs(paired["diff"]) <= stderr),
        "same_verdict_goal": SAME_VERDICT_GOAL,
        "same_verdict_met": bool(same_verdict >= SAME_VERDICT_GOAL),
    }


def main(argv: list[str] | None = None) -> int:
    import torch

    from ratchet.data.datasets_io import load_split
    from ratchet.data.prompts import make_prompt_fn
    from ratchet.data.reward import has_format, reward
    from ratchet.data.tokenizer import load_tokenizer
    from ratchet.trainer.precision import torch_dtype

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", required=True, type=Path, help="HF model dir or .gguf file")
    p.add_argument("--model-dir", required=True, type=Path, help="ratchet's converted model (tokenizer)")
    p.add_argument("--test", required=True, type=Path, help="test split parquet")
    p.add_argument("--data-source", default="local", help="data.source of the run (prompt format)")
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--num-problems", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=660)
    p.add_argument("--dtype", default="fp16", choices=["fp16", "bf16", "fp32"])
    p.add_argument("--answers", type=Path, help="ratchet's answers parquet, to count identical answers")
    p.add_argument("--out", required=True, type=Path)
    a = p.parse_args(argv)

    tokenizer = load_tokenizer(a.model_dir)
    problems = load_split(a.test)
    if a.num_problems:
        problems = problems.head(a.num_problems)
    prompt_fn = make_prompt_fn(tokenizer, a.data_source)
    prompts = [prompt_fn(q) for q in problems["question"]]
    dtype = torch_dtype(a.dtype)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.perf_counter()
    model = load_hf_model(a.source, dtype, device)
    load_s = time.perf_counter() - t0
    answers, wall = greedy_generate(model, prompts, a.max_new_tokens, tokenizer.eos_ids,
                                    tokenizer.pad_id, a.batch_size)
    texts = [tokenizer.decode(ans) for ans in answers]
    rewards = np.array([reward(t, tgt) for t, tgt in zip(texts, problems["target"])])
    n_tokens = sum(len(ans) for ans in answers)
    acc = float(rewards.mean())
    summary = {
        "reference": "transformers generate (greedy)", "source": str(a.source),
        "dtype": a.dtype, "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "n": len(texts), "accuracy": acc, "accuracy_stderr": float(np.sqrt(acc * (1 - acc) / len(texts))),
        "format_rate": float(np.mean([has_format(t) for t in texts])),
        "mean_tokens": n_tokens / len(texts), "wall_s": wall, "load_s": load_s,
        "tokens_per_s": n_tokens / wall, "batch_size": a.batch_size,
    }
    if a.answers and a.answers.is_file():
        summary |= compare_with_engine(pd.read_parquet(a.answers), problems["id"], texts, rewards)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
