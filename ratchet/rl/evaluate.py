"""Greedy evaluation, one function for the eval stages, the in-training evals and the
ablations: every problem once, answers scored by the task's reward."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd

from ratchet.data.reward import has_format, reward
from ratchet.engine.request import Request


def eval_inputs(cfg: dict) -> tuple:
    """(tokenizer, test problems, prompt_fn) of a run's greedy eval: the converted model's
    tokenizer, the test split cut to `eval.num_problems`, the data source's prompt."""
    from ratchet.data.datasets_io import load_split
    from ratchet.data.prompts import make_prompt_fn
    from ratchet.data.tokenizer import load_tokenizer
    from ratchet.paths import RunPaths

    paths = RunPaths.from_config(cfg)
    tokenizer = load_tokenizer(paths.model)
    problems = load_split(paths.test_data)
    if cfg["eval"]["num_problems"]:
        problems = problems.head(cfg["eval"]["num_problems"])
    return tokenizer, problems, make_prompt_fn(tokenizer, cfg["data"]["source"])


def evaluate(engine, tokenizer, problems: pd.DataFrame, prompt_ids, max_new_tokens: int,
             progress: bool = True) -> tuple[dict, pd.DataFrame]:
    """Return (summary, answers). `prompt_ids(question) -> list[int]` builds each prompt."""
    reqs = [Request(request_id=i, prompt=prompt_ids(q), max_new_tokens=max_new_tokens,
                    greedy=True, temperature=1.0)
            for i, q in enumerate(problems["question"])]
    t0 = time.perf_counter()
    done = engine.generate(reqs, progress=progress)
    wall = time.perf_counter() - t0
    texts = [tokenizer.decode(r.output) for r in done]
    rewards = np.array([reward(t, tgt) for t, tgt in zip(texts, problems["target"])])
    formatted = np.array([has_format(t) for t in texts])
    lengths = np.array([len(r.output) for r in done])
    truncated = np.array([r.finish_reason == "length" for r in done])
    answers = pd.DataFrame({
        "id": problems["id"].to_numpy(), "question": problems["question"].to_numpy(),
        "target": problems["target"].to_numpy(), "response": texts, "reward": rewards,
        "formatted": formatted, "num_tokens": lengths, "finish_reason": [r.finish_reason for r in done],
        "sum_logprob": [float(np.sum(r.logprobs)) for r in done],
    })
    n = len(done)
    acc = float(rewards.mean())
    summary = {
        "n": n,
        "accuracy": acc,
        # binomial standard error over the n problems: the honest uncertainty of `accuracy`
        "accuracy_stderr": float(np.sqrt(acc * (1 - acc) / n)) if n else 0.0,
        "format_rate": float(formatted.mean()),
        "truncated_share": float(truncated.mean()),
        "mean_tokens": float(lengths.mean()),
        "total_tokens": int(lengths.sum()),
        "wall_s": wall,
        "tokens_per_s": float(lengths.sum() / wall) if wall > 0 else 0.0,
    }
    return summary, answers


class Evaluator:
    """The in-training eval: greedy accuracy on the task's eval problems every `eval_every`
    steps and after the last, on an idle engine holding the trainer's weights."""

    def __init__(self, task, every: int, steps: int, max_new_tokens: int):
        self.task, self.every, self.steps, self.max_new_tokens = task, every, steps, max_new_tokens

    def due(self, step: int) -> bool:
        problems = self.task.eval_problems
        return bool(self.every and problems is not None and len(problems)
                    and (step % self.every == 0 or step == self.steps))

    def __call__(self, engine) -> dict[str, float]:
        start = time.perf_counter()
        summary, _ = evaluate(engine, self.task.tokenizer, self.task.eval_problems, self.task.prompt_fn,
                              self.max_new_tokens, progress=False)
        return {"eval/accuracy": summary["accuracy"], "time/eval_s": time.perf_counter() - start}
