"""vLLM behind the engine's public surface (`engine.backend: vllm`): add / step / cancel_all /
generate / update_weights / weight_checksums / score, for the rollouts, the evals and the
colocated loop. vLLM owns its scheduler and KV cache, so this adapts the whole engine, not a
slot-level Backend. It runs vLLM in-process (LLM.llm_engine), fed token ids, no tokenizer.

Where it differs from ratchet's engine (ratchet/engine/engine.py), on purpose or by necessity:
- Tokens come from vLLM's sampler (its per-request torch generator seeded from the request),
  not from ratchet's counter-based Gumbel noise: other tokens than the numpy/cuda backends for
  the same seed, and a token may depend on its batch (`batch_invariant` is False).
- Log-probabilities: `logprobs_mode="processed_logprobs"`, the log_softmax of the float32
  logits divided by the temperature (no top-k, top-p, min-p or penalty is ever set), which is
  ratchet's sampler's log_softmax(logits / T). vLLM divides greedy rows by 1: ratchet's value
  for greedy at T = 0 or 1 (the evals'); any other greedy temperature is refused.
- Resume after cancel: a new vLLM request whose prompt is prompt + output so far, with the
  budget left and a seed derived from (seed, request id, tokens so far): a rerun repeats the
  same tokens, but they are not those an uninterrupted run would have drawn.
- `score`: vLLM's prompt log-probs, which are taken before temperature: T = 1 (or 0) only,
  and not the bits the tokens were sampled with (vLLM prefill vs decode arithmetic).
- `weight_checksums`: of vLLM's own parameters (copied to the host to be summed).
"""

from __future__ import annotations

import hashlib
import importlib
import itertools
import os
import shutil
import tempfile
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np

from ratchet.engine.engine import EngineStats, engine_limits
from ratchet.engine.generate import run_to_completion
from ratchet.engine.request import Request, check_addable, check_scorable, stop_reason
from ratchet.errors import InputError
from ratchet.model.checksum import block_checksums
from ratchet.vllm.names import PADDED_VOCAB, hf_update, vllm_parameter

LOGPROBS_MODE = "processed_logprobs"  # after temperature: ratchet's log_softmax(logits / T)
VLLM_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
MULTIPROCESSING_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"
MIN_TEMPERATURE = 1e-2  # vLLM raises a temperature in (0, 0.01) to 0.01 (SamplingParams), silently
INSTALL_HINT = ("pip install 'ratchet[vllm]' on a CUDA machine, or on the offline GPU machine "
                "the wheelhouse that dev/gpu/vllm.sh installs")


@dataclass
class VllmOptions:
    """The `engine.vllm` section: what only vLLM has."""
    gpu_memory_utilization: float = 0.3  # vLLM's share of the GPU: the colocated trainer needs the rest
    enforce_eager: bool = False  # no CUDA graphs / compilation: starts in seconds, decodes slower

    @classmethod
    def from_dict(cls, d: Mapping | None) -> "VllmOptions":
        return cls(**dict(d or {}))


def import_vllm():
    """The vllm module, or one ImportError saying how to get it."""
    try:
        import vllm
    except Exception as e:  # not installed, or a broken install (CUDA libraries, torch pin)
        raise ImportError(f"engine.backend 'vllm': vLLM cannot be imported ({type(e).__name__}: {e}); "
                          f"{INSTALL_HINT}") from e
    return vllm


def in_process() -> None:
    """vLLM's engine in this process: the weight updates and checksums hand it a function to run
    on its model (apply_model), which vLLM's engine process cannot receive (its messages refuse
    functions). Set before vLLM is imported; a user's explicit 1 is refused, not overridden."""
    if os.environ.setdefault(MULTIPROCESSING_ENV, "0") != "0":
        raise InputError(f"engine.backend 'vllm' needs vLLM's engine in this process ({MULTIPROCESSING_ENV}=0): "
                         f"ratchet writes and reads its weights in place; {MULTIPROCESSING_ENV} is "
                         f"{os.environ[MULTIPROCESSING_ENV]!r} here")


def derived_seed(seed: int, request_id: int, start: int) -> int:
    """vLLM's seed for the tokens of request `request_id` from output index `start` on: a
    resumed request does not replay the random stream of its first part."""
    digest = hashlib.blake2b(f"{seed}:{request_id}:{start}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


class VllmEngine:
    backend_name = "vllm"
    batch_invariant = False  # vLLM's kernels give a row bits that depend on its batch

    def __init__(self, model, max_batch_size: int = 64, max_seq_len: int | None = None,
                 eos_ids: Iterable[int] | None = None, batch_invariant: bool = False,
                 device: int | None = None, options: Mapping | None = None, llm=None):
        """`model`: `.cfg`, `.weights`, `.dtype` (an EngineModel), written as a Hugging Face
        directory for vLLM to load in `model.dtype`. `llm`: an already started vllm.LLM (tests)."""
        if batch_invariant:
            raise InputError("engine.backend 'vllm' has no batch-invariant mode (the exact forward, "
                             "train.exact_forward / ablate.batch_invariant, needs the cuda backend)")
        if device not in (None, 0):
            raise InputError(f"engine.backend 'vllm' on GPU {device}: vLLM starts on the "
                                      "first visible GPU (set CUDA_VISIBLE_DEVICES instead)")
        self.cfg, self.dtype = model.cfg, model.dtype
        self.max_seq_len, self.eos_ids = engine_limits(model.cfg, max_batch_size, max_seq_len, eos_ids)
        self.max_batch_size = max_batch_size
        # score sends prompt + answer as one prompt and asks for a token past it: a sequence that
        # fills max_seq_len needs one position more (as far as the model has positions)
        self.max_model_len = min(self.max_seq_len + 1, model.cfg.max_position_embeddings)
        self.options = VllmOptions.from_dict(options)
        in_process()
        self.vllm = import_vllm()
        self._delta = importlib.import_module("vllm.sampling_params").RequestOutputKind.DELTA
        self.llm = llm if llm is not None else self._start(model)
        self.stats = EngineStats()
        self._running: dict[str, Request] = {}  # vLLM request id -> the request, in admission order
        self._no_budget: list[Request] = []  # added with nothing left to draw: finished by the next step
        self._ids = itertools.count()

    def _start(self, model):
        """Write the model as a Hugging Face directory (a temporary one, removed with the
        engine) and start vLLM on it in-process."""
        from ratchet.model.export_hf import export_hf

        if not self.options.enforce_eager and _torch().are_deterministic_algorithms_enabled():
            raise InputError(
                "engine.backend 'vllm': torch.use_deterministic_algorithms is on (the trainer's "
                "reproducible mode, in training and in the ablations), and vLLM's start-up "
                "compilation (torch.compile autotuning) refuses to run under it (seen with vLLM "
                "0.26 on an H200, after ~90 s of start-up); set engine.vllm.enforce_eager=true")
        tmp = Path(tempfile.mkdtemp(prefix="ratchet-vllm-"))
        weakref.finalize(self, shutil.rmtree, tmp, True)
        export_hf(model, tmp / "model", model.dtype, tokenizer_dir=None)
        return self.vllm.LLM(model=str(tmp / "model"), dtype=VLLM_DTYPES[model.dtype], seed=0,
                             max_model_len=self.max_model_len, max_num_seqs=self.max_batch_size,
                             logprobs_mode=LOGPROBS_MODE, skip_tokenizer_init=True,
                             generation_config="vllm",  # no sampling defaults from the directory
                             enable_prefix_caching=True,  # a group's answers share their prompt
                             gpu_memory_utilization=self.options.gpu_memory_utilization,
                             enforce_eager=self.options.enforce_eager)

    # ---------------------------------------------------------------- requests

    def add(self, request: Request) -> None:
        """Queue a new request, or a cancelled one to resume it (prompt + output so far)."""
        self.check_addable(request)
        self._queue(request)

    def _queue(self, request: Request) -> None:
        """`add` once `check_addable` has passed (generate checks its whole batch first)."""
        budget = min(request.max_new_tokens - len(request.output), self.max_seq_len - request.num_tokens)
        if self._stop_reason(request) is not None or budget < 1:
            self._no_budget.append(request)
            return
        vllm_id = f"{request.request_id}-{next(self._ids)}"
        self.llm.llm_engine.add_request(vllm_id, {"prompt_token_ids": request.prompt + request.output},
                                        self._sampling_params(request, budget))
        self._running[vllm_id] = request
        self.stats.num_prefill_tokens += request.num_tokens

    def check_addable(self, request: Request) -> None:
        """Raises what `add` would for `request`, queueing nothing."""
        queued = any(r.request_id == request.request_id for r in [*self._running.values(), *self._no_budget])
        check_addable(request, queued, self.cfg.vocab_size, self.max_seq_len)
        where = f"engine: request {request.request_id}"
        if request.greedy and request.temperature not in (0, 1):
            raise ValueError(f"{where}: greedy at temperature {request.temperature} on engine.backend "
                             "'vllm', whose greedy log-probabilities are at temperature 1 (use 0 or 1)")
        if not request.greedy and request.temperature < MIN_TEMPERATURE:
            raise ValueError(f"{where}: temperature {request.temperature} on engine.backend 'vllm', which "
                             f"samples below {MIN_TEMPERATURE} at {MIN_TEMPERATURE} (its log-probabilities "
                             "too): the gap would be vLLM's change of temperature")

    def step(self) -> list[Request]:
        """One vLLM step; returns the requests that finished in it."""
        start = time.perf_counter()
        finished = []
        for request in self._no_budget:
            request.finish_reason = self._stop_reason(request) or "length"
            finished.append(request)
        self._no_budget = []
        if self._running:
            outputs = self.llm.llm_engine.step()
            self.stats.num_decode_steps += 1
            for out in outputs:
                request = self._running.get(out.request_id)
                if request is not None:
                    finished += self._take(out, request)
        self.stats.wall_time_s += time.perf_counter() - start
        return finished

    def generate(self, requests: list[Request], progress: bool = False) -> list[Request]:
        """Run `requests` to completion; returns them in the given order (`progress`: a bar
        with requests done and tokens a second, as ratchet's engine shows)."""
        return run_to_completion(self, requests, self._queue, progress)

    def cancel(self, request_id: int) -> Request:
        """Stop a request; it keeps its output and logprobs, finish_reason stays None."""
        for vllm_id, request in self._running.items():
            if request.request_id == request_id:
                self.llm.llm_engine.abort_request([vllm_id])
                return self._running.pop(vllm_id)
        for i, request in enumerate(self._no_budget):
            if request.request_id == request_id:
                return self._no_budget.pop(i)
        raise KeyError(f"cancel: request {request_id} is neither running nor waiting")

    def cancel_all(self) -> list[Request]:
        """Cancel every running (in admission order), then every waiting request."""
        ids = list(self._running)
        if ids:
            self.llm.llm_engine.abort_request(ids)
        cancelled = [self._running.pop(i) for i in ids] + self._no_budget
        self._no_budget = []
        return cancelled

    @property
    def num_unfinished(self) -> int:
        return len(self._running) + len(self._no_budget)

    def drain(self, caller: str = "drain") -> None:
        """Refuse while requests are unfinished (vLLM has no step launched ahead to wait for)."""
        if self.num_unfinished:
            raise RuntimeError(f"{caller}: {self.num_unfinished} requests are running or waiting; "
                               "cancel or finish them first")

    # ---------------------------------------------------------------- weights

    @property
    def weight_device(self) -> str:
        """vLLM copies whatever it is given into its parameters; trainer tensors already on the
        GPU go straight there (ratchet/rl/sync.py for_engine)."""
        return "cuda:0"

    def update_weights(self, weights: Mapping[str, object]) -> None:
        """Overwrite any subset of the weights (engine names; NumPy arrays, torch or DLPack
        tensors) through the model's `load_weights`, which rounds them to vLLM's dtype; the
        prefix cache, computed with the old weights, is dropped."""
        self.drain("update_weights")
        named = [(name, _as_torch(rows)) for name, rows in hf_update(self.cfg, weights)]
        self.llm.apply_model(lambda model: model.load_weights(iter(named)))
        if self.llm.reset_prefix_cache() is False:
            raise RuntimeError("update_weights: vLLM refused to drop its prefix cache")

    def weight_checksums(self) -> dict[str, tuple[int, int]]:
        """Each engine tensor's checksum (ratchet/model/checksum.py) from the parameter vLLM
        holds for it, its vocabulary padding cut off; copied to the host to be summed."""
        from ratchet.model.layout import expected_shapes

        self.drain("weight_checksums")
        held = self.llm.apply_model(lambda model: dict(model.named_parameters()))[0]
        names = list(expected_shapes(self.cfg))
        missing = [n for n in names if vllm_parameter(n) not in held]
        if missing:
            raise NotImplementedError(f"weight_checksums: this vLLM model has no parameter "
                                      f"{vllm_parameter(missing[0])!r} (for {missing[0]!r})")
        words = []
        for name in names:
            tensor = held[vllm_parameter(name)].detach()
            if name in PADDED_VOCAB:
                tensor = tensor[:self.cfg.vocab_size]
            words.append(tensor.contiguous().reshape(-1).view(_torch().int16).cpu().numpy())
        return dict(zip(names, block_checksums(words, np)))

    # ---------------------------------------------------------------- scoring

    def score(self, prompts: list[list[int]], answers: list[list[int]], temperature: float = 1.0,
              batch_size: int | None = None) -> list[list[float]]:
        """The log-probability of every answer token by vLLM's prompt log-probs (one prefill
        per answer, vLLM batching them; `batch_size` unused). Only at T = 1 (or 0, greedy):
        vLLM takes prompt log-probs before temperature."""
        check_scorable(prompts, answers, self.cfg.vocab_size, self.max_seq_len)
        if temperature not in (0, 1):
            raise NotImplementedError(f"score at temperature {temperature} on engine.backend 'vllm': "
                                      "vLLM's prompt log-probabilities are before temperature")
        full = next((i for i, (p, a) in enumerate(zip(prompts, answers))
                     if a and len(p) + len(a) >= self.max_model_len), None)
        if full is not None:
            raise ValueError(f"teacher forcing: answer {full} fills the model's {self.max_model_len} positions; "
                             "vLLM scores a sequence as a prompt with a token to draw after it")
        self.drain("teacher forcing")
        sampling = self.vllm.SamplingParams
        out: list[list[float]] = [[] for _ in answers]
        waiting: dict[str, int] = {}
        try:
            for i, (prompt, answer) in enumerate(zip(prompts, answers)):
                if not answer:
                    continue
                vllm_id = f"score-{next(self._ids)}"
                params = sampling(temperature=0.0, max_tokens=1, prompt_logprobs=0, detokenize=False)
                self.llm.llm_engine.add_request(vllm_id, {"prompt_token_ids": list(prompt) + list(answer)}, params)
                waiting[vllm_id] = i
            while waiting:
                for result in self.llm.llm_engine.step():
                    i = waiting.get(result.request_id)
                    if i is None or not result.finished:
                        continue
                    del waiting[result.request_id]
                    begin, entries = len(prompts[i]), result.prompt_logprobs  # entry 0 is None
                    out[i] = [float(entries[begin + j][token].logprob) for j, token in enumerate(answers[i])]
        except BaseException:  # left in vLLM, they would run under the next weights
            if waiting:
                self.llm.llm_engine.abort_request(list(waiting))
            raise
        return out

    # ---------------------------------------------------------------- helpers

    def _sampling_params(self, request: Request, budget: int):
        """Plain sampling at the request's temperature (greedy: vLLM's temperature 0), the
        sampled token's log-probability, ratchet's eos ids as the only stop, token deltas."""
        greedy = request.greedy
        return self.vllm.SamplingParams(
            temperature=0.0 if greedy else float(request.temperature), max_tokens=budget,
            seed=None if greedy else derived_seed(request.seed, request.request_id, len(request.output)),
            logprobs=0, ignore_eos=True, stop_token_ids=sorted(self.eos_ids), detokenize=False,
            output_kind=self._delta)

    def _take(self, out, request: Request) -> list[Request]:
        """Append a step's new tokens and their log-probabilities; finish the request if vLLM did."""
        completion = out.outputs[0]
        tokens = [int(t) for t in completion.token_ids]
        entries = completion.logprobs or []  # a list of {token: Logprob}, or vLLM's FlatLogprobs
        if len(entries) != len(tokens):
            raise RuntimeError(f"vllm: request {request.request_id} got {len(tokens)} tokens but "
                               f"{len(entries)} log-probabilities")
        request.output += tokens
        request.logprobs += [float(entries[j][token].logprob) for j, token in enumerate(tokens)]
        self.stats.num_generated_tokens += len(tokens)
        if not out.finished:
            return []
        del self._running[out.request_id]
        reason = self._stop_reason(request)
        if reason is None:
            raise RuntimeError(f"vllm: request {request.request_id} finished "
                               f"({completion.finish_reason}) with neither eos nor its length limit")
        request.finish_reason = reason
        return [request]

    def _stop_reason(self, request: Request) -> str | None:
        """ratchet's rule (eos before length), not vLLM's finish_reason."""
        return stop_reason(request, self.eos_ids, self.max_seq_len)


def _torch():
    import torch

    return torch


def _as_torch(rows):
    """A torch view of `rows` (a NumPy array or any DLPack tensor); no copy."""
    torch = _torch()
    if isinstance(rows, torch.Tensor):
        return rows
    if isinstance(rows, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(rows))
    return torch.from_dlpack(rows)
