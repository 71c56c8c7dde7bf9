"""The padding each micro-batch setting costs on the study's lengths, on the CPU: prompts are
GSM8K training questions through the real model's chat template, answers the lengths of a
finished run's greedy answers capped at 384 (a proxy for the sampled ones), 64 a step drawn at
random; padded tokens (passes x their longest) over real ones, and the passes a step takes.

    python -m dev.padding --gguf .cache/real/qwen2.5-coder-0.5b-instruct.gguf \\
        --answers results/records/h200-learning/runs/fp16-none/answers.parquet
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

SETTINGS = (("one pass of 64", 64, None), ("passes of 8", 8, None), ("budget 16384 tokens", 64, 16384),
            ("budget 8192 tokens", 64, 8192))


def main(argv=None) -> None:
    from ratchet.data.prompts import make_prompt_fn
    from ratchet.data.tokenizer import load_tokenizer
    from ratchet.model.convert_gguf import write_gguf_tokenizer
    from ratchet.rl.update import micro_batches

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", type=Path, required=True)
    ap.add_argument("--train", type=Path, default=Path("../shared/data/gsm8k/train.jsonl"))
    ap.add_argument("--answers", type=Path, required=True, help="an ablate_learning run's answers.parquet")
    ap.add_argument("--max-new-tokens", type=int, default=384)
    ap.add_argument("--trials", type=int, default=200)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        write_gguf_tokenizer(args.gguf, tmp)
        prompt_fn = make_prompt_fn(load_tokenizer(tmp), "local")
    questions = pd.read_json(args.train, lines=True)["question"][:2000]
    prompts = np.array([len(prompt_fn(q)) for q in questions])
    answers = pd.read_parquet(args.answers)
    answers = np.minimum(answers[answers["step"] == answers["step"].max()]["num_tokens"].to_numpy(), args.max_new_tokens)
    rng = np.random.default_rng(0)
    ratios: dict[str, list] = {name: [] for name, _, _ in SETTINGS}
    for _ in range(args.trials):
        p = [[0] * int(n) for n in rng.choice(prompts, 64)]
        r = [[0] * int(n) for n in rng.choice(answers, 64)]
        real = sum(len(a) + len(b) for a, b in zip(p, r))
        for name, size, budget in SETTINGS:
            cut = micro_batches(range(64), p, r, size, budget)
            padded = sum(len(mb) * max(len(p[i]) + len(r[i]) for i in mb) for mb in cut)
            ratios[name].append((padded / real, len(cut)))
    out = {"prompt_tokens_mean": float(prompts.mean()), "answer_tokens_mean": float(answers.mean()),
           **{name: {"padded_over_real": float(np.mean([x for x, _ in v])), "passes": float(np.mean([n for _, n in v]))}
              for name, v in ratios.items()}}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
