"""The tiny profile's task: one-digit arithmetic that GRPO can teach a randomly initialised model.

A prompt is zero-padded operands joined by '+' and ended by '=' ("037+2="); the response is
one digit, the last digit of the sum ("9"), then `<eos>`. Only the units digits decide the
answer and the padding keeps them at fixed distances before '='. The default, a three-digit
number plus 0, 1 or 2 (`max_operand=(999, 2)`), has 30 digit pairs to learn and every answer
equally often (no majority answer to collapse onto), while the distracting higher digits give
3,000 prompts, so train and test share no prompt yet follow the same rule.

ops: "add_mod10" (default): the sum mod 10. "add_nocarry": only operands whose units digits sum
below 10, so the answer is that sum (fewer pairs, but unbalanced answers: 9 is the most common).

How learnable (measured with a throwaway 2-layer, d=64 PyTorch transformer from random init,
GRPO with 32 prompts x 8 samples a step, Adam lr 1e-3, max_new_tokens 2, 200 steps, train
reward / greedy test accuracy at step 200, from ~0.04 at step 0):
  (999, 2) default, seeds 0/1/2:   0.95/0.86, 0.61/0.75, 0.45/0.37 (the last at max_new_tokens 4)
  (999, 4), 50 pairs:              0.27/0.32
  (99, 9) and 99+99, 100 pairs:    ~0.12/0.10 (right format, guessed digit; no progress)
At lr 3e-3 the same loop often collapsed onto one answer per first digit, so the lr matters
as much as the table size.

Why a random policy earns reward: the vocabulary is 2 specials + 12 characters, so a near-
uniform policy writes the right digit first about 1 time in 14, and `reward.reward` reads the
last number of the response, so "7<eos>" (and "+7<eos>") scores while "37" does not.
`random_policy_reward` measures it: about 0.04 per sample with max_new_tokens=2 and 0.025 with
4, so a batch of 32 groups of 8 holds several groups with a success: a nonzero advantage.

Splits: test is drawn first, then train from the remaining prompts, both without repeats. When
the space holds fewer than n_train + n_test prompts, train is drawn *with* repeats from what the
test split left (still disjoint from test); fewer than n_test + 1 prompts is an error.
"""

from __future__ import annotations

from math import prod

import numpy as np
import pandas as pd

from ratchet.data.reward import reward
from ratchet.errors import InputError

ALPHABET = "0123456789+="
OPS = ("add_mod10", "add_nocarry")
MAX_ENUMERATED = 10_000_000  # "add_nocarry" lists its valid prompts; beyond this, refuse


def make_arithmetic(n_train: int, n_test: int, seed: int = 0,
                    max_operand: int | tuple[int, ...] = (999, 2), n_operands: int = 2,
                    op: str = "add_mod10") -> tuple[pd.DataFrame, pd.DataFrame]:
    """(train, test) DataFrames with columns id, question, answer, target; seeded.

    `max_operand` bounds every operand, or each one when it is a tuple (then `n_operands` is
    its length): (999, 3) asks "037+2=".
    """
    if n_train < 1 or n_test < 1:
        raise InputError(f"synthetic: n_train and n_test must be positive, got {n_train}, {n_test}")
    bounds = _bounds(max_operand, n_operands)
    space = _space(bounds, op)
    size = space if isinstance(space, int) else len(space)
    if size <= n_test:
        raise InputError(f"synthetic: {size} distinct prompts cannot hold a test split of "
                         f"{n_test} and a disjoint train split; raise max_operand or n_operands")
    rng = np.random.default_rng(seed)
    if size >= n_train + n_test:
        picked = rng.choice(size, size=n_train + n_test, replace=False)
        test_idx, train_idx = picked[:n_test], picked[n_test:]
    else:
        order = rng.permutation(size)
        test_idx, rest = order[:n_test], order[n_test:]
        train_idx = rest[rng.integers(0, len(rest), size=n_train)]
    if not isinstance(space, int):  # positions in the list of valid prompts -> prompt indices
        train_idx, test_idx = space[train_idx], space[test_idx]
    return _frame(train_idx, bounds), _frame(test_idx, bounds)


def problem_space_size(max_operand: int | tuple[int, ...] = (999, 2), n_operands: int = 2,
                       op: str = "add_mod10") -> int:
    space = _space(_bounds(max_operand, n_operands), op)
    return space if isinstance(space, int) else len(space)


def random_policy_reward(df: pd.DataFrame, max_new_tokens: int = 4, samples: int = 20,
                         seed: int = 0, alphabet: str = ALPHABET) -> float:
    """Mean reward of a uniform policy over `<pad>`, `<eos>` and the alphabet (what a freshly
    initialised model is close to), stopping at `<eos>`; `<pad>` decodes to nothing."""
    rng = np.random.default_rng(seed)
    vocab = ["", None, *alphabet]  # None: eos
    total, count = 0.0, 0
    for target in df["target"]:
        for _ in range(samples):
            text = []
            for token in rng.integers(0, len(vocab), size=max_new_tokens):
                if vocab[token] is None:
                    break
                text.append(vocab[token])
            total += reward("".join(text), target)
            count += 1
    return total / count


def _bounds(max_operand: int | tuple[int, ...], n_operands: int) -> tuple[int, ...]:
    bounds = (max_operand,) * n_operands if isinstance(max_operand, int) else tuple(max_operand)
    if len(bounds) < 2 or min(bounds) < 1:
        raise InputError(f"synthetic: need at least two operands, each bounded by >= 1; got "
                         f"max_operand={max_operand!r}, n_operands={n_operands}")
    return tuple(int(b) for b in bounds)


def _space(bounds: tuple[int, ...], op: str) -> int | np.ndarray:
    """The number of prompts (every operand tuple is valid) or the indices of the valid ones."""
    if op not in OPS:
        raise InputError(f"synthetic: unknown op {op!r}; expected one of {OPS}")
    size = prod(b + 1 for b in bounds)
    if op == "add_mod10":
        return size
    if size > MAX_ENUMERATED:
        raise InputError(f"synthetic: op 'add_nocarry' enumerates its {size} operand tuples; "
                         f"keep the product of (max_operand + 1) <= {MAX_ENUMERATED}")
    return np.flatnonzero((_operands(np.arange(size), bounds) % 10).sum(axis=1) < 10)


def _operands(index: np.ndarray, bounds: tuple[int, ...]) -> np.ndarray:
    """Prompt index -> operand tuple, mixed radix with the first operand most significant:
    [N, n_operands]."""
    radices = np.array([b + 1 for b in bounds], dtype=np.int64)
    place = np.cumprod(radices[::-1])[::-1] // radices  # weight of each operand's digit
    return np.asarray(index, dtype=np.int64)[:, None] // place % radices


def _frame(index: np.ndarray, bounds: tuple[int, ...]) -> pd.DataFrame:
    operands = _operands(index, bounds)
    widths = [len(str(b)) for b in bounds]
    questions = ["+".join(str(x).zfill(w) for x, w in zip(row, widths)) + "="
                 for row in operands.tolist()]
    targets = [str(x) for x in (operands.sum(axis=1) % 10).tolist()]
    return pd.DataFrame({"id": np.arange(len(questions), dtype=np.int64), "question": questions,
                         "answer": targets, "target": targets})
