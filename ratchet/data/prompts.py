"""What the policy is shown for each task.

GSM8K: a system message asking for step-by-step reasoning and the final number after '####'
(the format `reward.has_format` checks), and the question as the user turn. The synthetic task:
the raw question ("037+2="), no template, no system message.

    prompt_fn = make_prompt_fn(tokenizer, "hub")  # data.source: synthetic | hub | local
    ids = prompt_fn(question)
"""

from __future__ import annotations

GSM8K_SYSTEM = (
    "You are a helpful assistant that solves grade school math problems. Reason step by step, "
    "then write the final answer as a plain number on the last line, after '####', "
    "for example:\n#### 42"
)

TASKS = ("gsm8k", "arithmetic")
# data.source in the config -> the task its problems belong to
SOURCE_TASKS = {"synthetic": "arithmetic", "hub": "gsm8k", "local": "gsm8k",
                "gsm8k": "gsm8k", "arithmetic": "arithmetic"}


def gsm8k_prompt(question: str) -> str:
    """The user turn for a GSM8K problem."""
    return question.strip()


def arithmetic_prompt(question: str) -> str:
    """The synthetic task's prompt is the question itself ("37+45=")."""
    return question


def task_prompt(task: str, question: str) -> tuple[str, str | None]:
    """(user text, system message or None) for `Tokenizer.prompt_ids(user, system=system)`."""
    if task == "gsm8k":
        return gsm8k_prompt(question), GSM8K_SYSTEM
    if task == "arithmetic":
        return arithmetic_prompt(question), None
    raise ValueError(f"prompts: unknown task {task!r}; expected one of {TASKS}")


def source_task(source: str) -> str:
    """The task of a data source ("synthetic", "hub", "local") or task name."""
    if source not in SOURCE_TASKS:
        raise ValueError(f"prompts: unknown data source {source!r}; expected one of "
                         f"{sorted(SOURCE_TASKS)}")
    return SOURCE_TASKS[source]


def make_prompt_fn(tokenizer, source: str):
    """question -> prompt ids for a data source ("synthetic", "hub", "local") or task name."""
    task = source_task(source)

    def prompt_fn(question: str) -> list[int]:
        user, system = task_prompt(task, question)
        return tokenizer.prompt_ids(user, system=system)

    return prompt_fn


def prompts_for(tokenizer, source: str, questions) -> list[list[int]]:
    """`make_prompt_fn(tokenizer, source)` of every question, encoded as one batch."""
    task = source_task(source)
    return tokenizer.encode_batch([tokenizer.render_prompt(*task_prompt(task, q)) for q in questions])
