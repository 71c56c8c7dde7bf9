"""A minimal stand-in for the parts of vLLM the adapter touches (ratchet/vllm/engine.py): `LLM`
with `llm_engine.add_request / step / abort_request`, `apply_model`, `reset_prefix_cache`;
`SamplingParams`; outputs shaped like vLLM's RequestOutput / CompletionOutput with
`{token: Logprob}` dicts. Its "model" draws tokens from a seeded hash of what it was given,
so the tests know which token and log-probability each step must yield.

    install(monkeypatch)  # sys.modules["vllm"], ["vllm.sampling_params"] -> this fake
"""

from __future__ import annotations

import enum
import types
from dataclasses import dataclass, field

import numpy as np


class RequestOutputKind(enum.Enum):
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


@dataclass
class SamplingParams:
    temperature: float = 1.0
    max_tokens: int | None = 16
    min_tokens: int = 0
    seed: int | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    detokenize: bool = True
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None


@dataclass
class CompletionOutput:
    index: int
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None


def fake_token(seed: int | None, tokens: list[int], vocab: int) -> tuple[int, float]:
    """The fake model's next token after `tokens` and its log-probability (greedy: seed None)."""
    rng = np.random.default_rng([0 if seed is None else seed % 2**32, len(tokens), sum(tokens) % 9973])
    token = int(rng.integers(vocab))
    return token, -0.01 * (token + 1)


def fake_prompt_logprob(previous: list[int], token: int) -> float:
    return -0.001 * (len(previous) + token)


class FakeModel:
    """What `apply_model` hands the function: `load_weights` records, `named_parameters`."""

    def __init__(self, parameters: dict | None = None):
        self.loaded: list[list[tuple[str, object]]] = []
        self.parameters = parameters or {}

    def load_weights(self, weights):
        batch = list(weights)
        self.loaded.append(batch)
        return {name for name, _ in batch}

    def named_parameters(self):
        return iter(self.parameters.items())


class FakeLLMEngine:
    def __init__(self, vocab: int):
        self.vocab = vocab
        self.live: dict[str, dict] = {}
        self.added: list[tuple[str, list[int], SamplingParams]] = []
        self.aborted: list[str] = []
        self.steps = 0

    def add_request(self, request_id: str, prompt: dict, params: SamplingParams) -> str:
        assert request_id not in self.live, f"duplicate vLLM request id {request_id}"
        assert params.max_tokens >= 1
        ids = list(prompt["prompt_token_ids"])
        self.added.append((request_id, ids, params))
        self.live[request_id] = {"prompt": ids, "params": params, "out": []}
        return request_id

    def has_unfinished_requests(self) -> bool:
        return bool(self.live)

    def abort_request(self, request_ids: list[str], internal: bool = False) -> None:
        for request_id in request_ids:
            self.aborted.append(request_id)
            self.live.pop(request_id)

    def step(self) -> list[RequestOutput]:
        self.steps += 1
        outputs = []
        for request_id, state in list(self.live.items()):
            params, prompt, out = state["params"], state["prompt"], state["out"]
            if params.prompt_logprobs is not None:  # scoring: every prompt token, one step
                entries = [None] + [{t: Logprob(fake_prompt_logprob(prompt[:i], t))}
                                    for i, t in enumerate(prompt) if i > 0]
                del self.live[request_id]
                outputs.append(RequestOutput(request_id, prompt, [CompletionOutput(0, [0], None, "length")],
                                             True, entries))
                continue
            token, logprob = fake_token(params.seed, prompt + out, self.vocab)
            out.append(token)
            stop = token in params.stop_token_ids
            finished = stop or len(out) >= params.max_tokens
            if finished:
                del self.live[request_id]
            outputs.append(RequestOutput(request_id, prompt, [CompletionOutput(
                0, [token], [{token: Logprob(logprob, 1)}],
                ("stop" if stop else "length") if finished else None)], finished))
        return outputs


class FakeLLM:
    instances: list["FakeLLM"] = []

    def __init__(self, model: str = "", vocab: int = 64, parameters: dict | None = None, **kwargs):
        self.model_path, self.kwargs = model, kwargs
        self.llm_engine = FakeLLMEngine(vocab)
        self.model = FakeModel(parameters)
        self.prefix_resets = 0
        FakeLLM.instances.append(self)

    def apply_model(self, func):
        return [func(self.model)]

    def reset_prefix_cache(self) -> bool:
        self.prefix_resets += 1
        return True


def install(monkeypatch, vocab: int | None = None) -> types.ModuleType:
    """The fake as `vllm`; `vocab`: its LLM draws tokens below this (a small model's vocabulary)."""
    module = types.ModuleType("vllm")
    llm = FakeLLM
    if vocab is not None:
        class SmallVocabLLM(FakeLLM):
            def __init__(self, model: str = "", **kwargs):
                super().__init__(model, vocab=vocab, **kwargs)

        llm = SmallVocabLLM
    module.LLM, module.SamplingParams, module.__version__ = llm, SamplingParams, "fake"
    sampling = types.ModuleType("vllm.sampling_params")
    sampling.SamplingParams, sampling.RequestOutputKind = SamplingParams, RequestOutputKind
    module.sampling_params = sampling
    monkeypatch.setitem(__import__("sys").modules, "vllm", module)
    monkeypatch.setitem(__import__("sys").modules, "vllm.sampling_params", sampling)
    return module
