"""The one object that travels through the engine: a prompt, its sampling settings, its
output. A cancelled request keeps its output with `finish_reason=None`; added again, it
resumes with the tokens an uninterrupted run would have drawn."""

from __future__ import annotations

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
        if self.max_new_tokens < 0:
            raise ValueError(f"{where}: max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if self.temperature < 0 or (self.temperature == 0 and not self.greedy):
            raise ValueError(f"{where}: temperature must be > 0 unless greedy "
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
