"""The one object that travels through the engine: a prompt, its sampling settings, its
output. A cancelled request keeps its output with `finish_reason=None`; added again, it
resumes with the tokens an uninterrupted run would have drawn."""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field

FINISH_REASONS = ("eos", "length")


@dataclass
class Request:
    request_id: int
    prompt: list[int]
    max_new_tokens: int
    temperature: float = 1.0
    greedy: bool = False
    seed: int = 0  # any int; the RNG key uses it modulo 2**32
    output: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # log_softmax(logits / T)[token]
    finish_reason: str | None = None  # "eos", "length", or None while unfinished/cancelled

    def __post_init__(self):
        where = f"request {self.request_id!r}"
        if not isinstance(self.request_id, int) or not 0 <= self.request_id < 2**32:
            # the id is half of the RNG key (as uint32): larger ids would share random streams
            raise ValueError(f"{where}: request_id must be an int in [0, 2**32)")
        self.prompt = [int(t) for t in self.prompt]
        if not self.prompt:
            raise ValueError(f"{where}: prompt is empty")
        self.max_new_tokens = _whole(self.max_new_tokens, f"{where}: max_new_tokens")
        if self.max_new_tokens < 0:
            raise ValueError(f"{where}: max_new_tokens must be >= 0, got {self.max_new_tokens}")
        self.seed = _whole(self.seed, f"{where}: seed")
        # NaN fails every comparison: checked as what is allowed, not as what is refused
        if not (self.temperature > 0 or (self.greedy and self.temperature == 0)) or math.isinf(self.temperature):
            raise ValueError(f"{where}: temperature must be finite and > 0 unless greedy "
                             f"(greedy allows 0), got {self.temperature}")
        if len(self.output) != len(self.logprobs):
            raise ValueError(f"{where}: output has {len(self.output)} tokens but logprobs "
                             f"has {len(self.logprobs)}")
        if self.finish_reason not in (None, *FINISH_REASONS):
            raise ValueError(f"{where}: finish_reason {self.finish_reason!r} is not one of "
                             f"{(None, *FINISH_REASONS)}")

    @property
    def num_tokens(self) -> int:
        """Prompt plus output: the length of the sequence the model has seen or will see."""
        return len(self.prompt) + len(self.output)


def stops_by_length(request: Request, max_seq_len: int, ahead: int = 0) -> bool:
    """Whether a length limit stops the request once `ahead` more tokens are appended."""
    return (len(request.output) + ahead >= request.max_new_tokens
            or request.num_tokens + ahead >= max_seq_len)


def stop_reason(request: Request, eos_ids, max_seq_len: int) -> str | None:
    """Why the request is done after its last token, eos before length; None if it is not."""
    if request.output and request.output[-1] in eos_ids:
        return "eos"
    return "length" if stops_by_length(request, max_seq_len) else None


def check_addable(request: Request, queued: bool, vocab_size: int, max_seq_len: int) -> None:
    """What every engine refuses to queue (`queued`: its id is already running or waiting)."""
    where = f"engine: request {request.request_id}"
    if request.finish_reason is not None:
        raise ValueError(f"{where} already finished ({request.finish_reason}); "
                         "only unfinished or cancelled requests can be added")
    if queued:
        raise ValueError(f"{where} is already running or waiting (request ids must be unique)")
    bad = [t for t in request.prompt + request.output if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"{where}: token id {bad[0]} is outside the vocabulary [0, {vocab_size})")
    if len(request.prompt) >= max_seq_len:
        raise ValueError(f"{where}: prompt of {len(request.prompt)} tokens leaves no room "
                         f"under max_seq_len {max_seq_len}")


def check_scorable(prompts: list[list[int]], answers: list[list[int]], vocab_size: int,
                   max_seq_len: int) -> None:
    """What every engine's `score` refuses before it runs anything: a token outside the
    vocabulary would be read as another (NumPy wraps -1 to the last row) or as "draw"."""
    if len(prompts) != len(answers):
        raise ValueError(f"teacher forcing: {len(prompts)} prompts for {len(answers)} answers")
    for i, (prompt, answer) in enumerate(zip(prompts, answers)):
        if not len(prompt):
            raise ValueError(f"teacher forcing: prompt {i} is empty")
        for name, tokens in (("prompt", prompt), ("answer", answer)):
            if len(tokens) and not (0 <= min(tokens) and max(tokens) < vocab_size):
                bad = next(t for t in tokens if not 0 <= t < vocab_size)
                raise ValueError(f"teacher forcing: {name} {i} has token id {bad}, outside the "
                                 f"vocabulary [0, {vocab_size})")
        if len(prompt) + len(answer) > max_seq_len:
            raise ValueError(f"teacher forcing: answer {i} ({len(prompt)} + {len(answer)} tokens) "
                             f"is past the engine's max_seq_len {max_seq_len}")


def check_unique_ids(requests: list[Request]) -> list[int]:
    """The requests' ids, refused if one appears twice (a generate call's batch)."""
    ids = [r.request_id for r in requests]
    if len(set(ids)) != len(ids):
        duplicate = next(i for i in ids if ids.count(i) > 1)
        raise ValueError(f"generate: request_id {duplicate} appears more than once")
    return ids


def _whole(value, what: str) -> int:
    """`value` as an int (NumPy integers too), refusing floats and NaN, which compare false
    with every bound and would slip past the checks after them."""
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(f"{what} must be an integer, got {value!r}") from None
