"""What GRPO trains on: the training prompts and targets, the reward of an answer, and the
test problems of the in-training eval."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pandas as pd


@dataclass
class Task:
    prompts: list[list[int]]
    targets: list[str]
    tokenizer: object
    eval_problems: pd.DataFrame | None = None  # test problems of the in-training eval
    prompt_fn: Callable | None = None  # question -> prompt ids

    @classmethod
    def load(cls, model_dir, train_path, data_source: str, test_path=None,
             eval_problems: int = 0) -> "Task":
        from ratchet.data.datasets_io import load_split
        from ratchet.data.prompts import make_prompt_fn, prompts_for
        from ratchet.data.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(model_dir)
        prompt_fn = make_prompt_fn(tokenizer, data_source)
        train = load_split(train_path)
        task = cls(prompts_for(tokenizer, data_source, train["question"]), list(train["target"]), tokenizer,
                   prompt_fn=prompt_fn)
        if test_path is not None and eval_problems:
            task.eval_problems = load_split(test_path).head(eval_problems)
        return task

    def reward(self, output: list[int], target: str) -> float:
        from ratchet.data.reward import reward

        return reward(self.tokenizer.decode(output), target)
