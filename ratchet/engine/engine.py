"""The engine: continuous batching over a backend, with tokens keyed by (seed, request id,
token index), so an answer depends neither on its batch nor on being cancelled and resumed.

    engine = Engine(load_engine_model(model_dir), backend="numpy", max_batch_size=64)
    done = engine.generate([Request(0, prompt_ids, max_new_tokens=256, seed=1)])
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable, Mapping

import numpy as np

from ratchet.engine.factory import make_backend
from ratchet.engine.generate import run_to_completion
from ratchet.engine.request import Request, check_addable, stop_reason, stops_by_length
from ratchet.engine.sampling import SamplingBatch
from ratchet.engine.scheduler import Scheduler, Sequence
from ratchet.engine.score import teacher_forced_logprobs


@dataclass
class _Launched:
    """A decode step on its way: the sequences of its rows, in order, and the backend's handle."""
    seqs: list[Sequence]
    handle: object

DEFAULT_MAX_SEQ_LEN = 4096


@dataclass
class EngineStats:
    num_generated_tokens: int = 0
    num_prefill_tokens: int = 0  # prompt (and resumed output) tokens run through prefill
    num_decode_steps: int = 0
    wall_time_s: float = 0.0  # inside step()

    @property
    def tokens_per_s(self) -> float:
        return self.num_generated_tokens / self.wall_time_s if self.wall_time_s else 0.0


def engine_limits(cfg, max_batch_size: int, max_seq_len: int | None,
                  eos_ids: Iterable[int] | None) -> tuple[int, frozenset[int]]:
    """(max_seq_len, eos ids) of an engine on `cfg`, its sizes checked: what every engine
    (ratchet's, the vLLM adapter) takes by default and refuses."""
    if max_seq_len is None:
        max_seq_len = min(cfg.max_position_embeddings, DEFAULT_MAX_SEQ_LEN)
    if max_batch_size < 1:
        raise ValueError(f"engine: max_batch_size must be >= 1, got {max_batch_size}")
    if max_seq_len < 2:
        raise ValueError(f"engine: max_seq_len must be >= 2, got {max_seq_len}")
    return max_seq_len, frozenset(int(t) for t in (cfg.eos_token_ids if eos_ids is None else eos_ids))


class Engine:
    def __init__(self, model, backend: str = "numpy", max_batch_size: int = 64,
                 max_seq_len: int | None = None, eos_ids: Iterable[int] | None = None,
                 overlap: bool = True, batch_invariant: bool = False, device: int | None = None):
        """`model`: `.cfg`, `.weights` (float32 on the dtype grid) and `.dtype`, e.g. an
        EngineModel. `overlap`: launch each decode step before reading the previous one's
        tokens. `batch_invariant`: rows' bits independent of the batch, so `score` gives an
        answer the bits it was sampled with. `device`: the GPU of a CUDA engine."""
        cfg = model.cfg
        self.cfg, self.dtype = cfg, model.dtype
        self.max_seq_len, self.eos_ids = engine_limits(cfg, max_batch_size, max_seq_len, eos_ids)
        self.max_batch_size = max_batch_size
        self.backend_name = backend
        self.backend = make_backend(backend, cfg, model.dtype, max_batch_size, self.max_seq_len,
                                    batch_invariant, device)
        self.backend.load_weights(model.weights)
        self.scheduler = Scheduler(max_batch_size)
        self.stats = EngineStats()
        self.overlap = overlap
        self._inflight: _Launched | None = None  # launched, its tokens not yet appended

    # ---------------------------------------------------------------- public API

    def add(self, request: Request) -> None:
        """Queue a new request, or a cancelled one to resume it."""
        self.check_addable(request)
        self.scheduler.add(request)

    def check_addable(self, request: Request) -> None:
        """Raises what `add` would for `request`, queueing nothing."""
        check_addable(request, request.request_id in self.scheduler, self.cfg.vocab_size, self.max_seq_len)

    def step(self) -> list[Request]:
        """Admit and prefill what fits, decode one token for every running sequence; returns
        the requests that finished in this step."""
        start = time.perf_counter()
        finished = []
        if self._inflight is None:  # else the running sequences' next step is already launched
            finished += self._prefill(self.scheduler.admit())
            running = list(self.scheduler.running.values())
            if running:
                self._inflight = self._launch(running)
        if self._inflight is not None:
            finished += self._complete()
        self.stats.wall_time_s += time.perf_counter() - start
        return finished

    def generate(self, requests: list[Request], progress: bool = False) -> list[Request]:
        """Run `requests` to completion; returns them in the given order (`progress`: a bar
        with requests done and tokens a second)."""
        return run_to_completion(self, requests, self.scheduler.add, progress)

    def cancel(self, request_id: int) -> Request:
        """Stop a request; it keeps its output and logprobs, finish_reason stays None."""
        seq = self.scheduler.running.get(request_id)
        if seq is not None:
            self._release(seq)
            return seq.request
        request = self.scheduler.remove_waiting(request_id)
        if request is None:
            raise KeyError(f"cancel: request {request_id} is neither running nor waiting")
        return request

    def cancel_all(self) -> list[Request]:
        """Cancel every running (in admission order), then every waiting request."""
        ids = list(self.scheduler.running) + [r.request_id for r in self.scheduler.waiting]
        return [self.cancel(i) for i in ids]

    def update_weights(self, weights: Mapping[str, object]) -> None:
        """Overwrite any subset of the weights in place (NumPy float32 arrays on the dtype grid,
        or DLPack tensors on `weight_device`); drops all cached state."""
        self.drain("update_weights")
        self.backend.update_weights(weights)

    def drain(self, caller: str = "drain") -> None:
        """Wait for the step launched ahead of finished rows, if any, so that the backend is
        free for direct use (a weight update, ratchet/engine/score.py); refuses while
        requests are unfinished."""
        if not self.scheduler.is_idle:
            raise RuntimeError(f"{caller}: {self.num_unfinished} requests are running or waiting; "
                               "cancel or finish them first")
        self._drain()

    def weight_checksums(self) -> dict[str, tuple[int, int]]:
        """Each weight tensor's checksum as the engine holds it (ratchet/model/checksum.py)."""
        self.drain("weight_checksums")
        return self.backend.weight_checksums()

    def score(self, prompts: list[list[int]], answers: list[list[int]], temperature: float = 1.0,
              batch_size: int | None = None) -> list[list[float]]:
        """The log-probability of every given answer token by this engine's own arithmetic
        (teacher forcing, score.py), a list per answer; the engine must be idle."""
        return teacher_forced_logprobs(self, prompts, answers, temperature, batch_size)

    @property
    def weight_device(self) -> str:
        """Where `update_weights` takes tensors without a host copy: "cpu" (NumPy arrays) or
        "cuda:N" (DLPack tensors on that GPU)."""
        return self.backend.weight_device

    @property
    def batch_invariant(self) -> bool:
        """Whether `score` gives sampled answers the very bits they were sampled with."""
        return self.backend.batch_invariant

    @property
    def num_unfinished(self) -> int:
        return len(self.scheduler.running) + len(self.scheduler.waiting)

    # ---------------------------------------------------------------- the step

    def _prefill(self, admitted: list[Sequence]) -> list[Request]:
        """Prefill the admitted sequences (prompt, + output if resuming); draw their next token."""
        finished, ready = [], []
        for seq in admitted:
            reason = self._stop_reason(seq.request)  # a resumed request may have no budget left
            if reason is not None:
                finished.append(self._finish(seq, reason))
            else:
                ready.append(seq)
        if not ready:
            return finished
        token_lists = [s.request.prompt + s.request.output for s in ready]
        tokens, logprobs = self.backend.prefill_sample([s.slot for s in ready], token_lists,
                                                       self._sampling_batch(ready))
        for seq, ids in zip(ready, token_lists):
            seq.num_cached_tokens = len(ids)
            self.stats.num_prefill_tokens += len(ids)
        return finished + self._append(ready, tokens, logprobs)

    def _launch(self, seqs: list[Sequence], after: _Launched | None = None) -> _Launched:
        """Launch a decode step for `seqs`: their last tokens from the host, or with `after`
        (the launched step they continue, its tokens not yet read) the tokens it draws."""
        if after is None:
            tokens, feed, ahead = [s.request.output[-1] for s in seqs], None, 0
        else:
            row = {id(s): i for i, s in enumerate(after.seqs)}
            tokens, feed, ahead = [0] * len(seqs), [row[id(s)] for s in seqs], 1
        handle = self.backend.decode_sample_async(
            [s.slot for s in seqs], tokens, [s.num_cached_tokens for s in seqs],
            self._sampling_batch(seqs, ahead), feed=feed)
        for seq in seqs:
            seq.num_cached_tokens += 1
        return _Launched(seqs, handle)

    def _complete(self) -> list[Request]:
        """Read the launched step's tokens and append them to the sequences still running,
        having launched the next step first (overlap) unless a waiting request could take a
        slot. A row whose sequence ended meanwhile is dropped: draws are keyed by token index."""
        step, self._inflight = self._inflight, None
        keep = [i for i, s in enumerate(step.seqs) if self._is_running(s)]  # not finished or cancelled since
        live = [step.seqs[i] for i in keep]
        go_on = [s for s in live if not self._stops_by_length(s.request, 1)]
        admissible = self.scheduler.waiting and (self.scheduler.free_slots or len(go_on) < len(live))
        nxt = self._launch(go_on, after=step) if self.overlap and go_on and not admissible else None
        tokens, logprobs = step.handle.result()
        self.stats.num_decode_steps += 1
        finished = self._append(live, tokens[keep], logprobs[keep])
        if nxt is not None:
            self._inflight = nxt
            if not any(self._is_running(s) for s in nxt.seqs):
                self._drain()  # every row drew eos: nothing to append
        return finished

    def _drain(self) -> None:
        """Wait for the launched step, if any, and drop it (its rows' sequences are gone)."""
        if self._inflight is not None:
            self._inflight.handle.result()
            self._inflight = None

    def _is_running(self, seq: Sequence) -> bool:
        return self.scheduler.running.get(seq.request.request_id) is seq

    def _stops_by_length(self, request: Request, ahead: int = 0) -> bool:
        return stops_by_length(request, self.max_seq_len, ahead)

    @staticmethod
    def _sampling_batch(seqs: list[Sequence], ahead: int = 0) -> SamplingBatch:
        """`ahead`: tokens the sequences will have been given before this draw (a step
        launched before the previous one's tokens were appended)."""
        requests = [s.request for s in seqs]
        return SamplingBatch(seeds=[r.seed % 2**32 for r in requests],  # any int: the key is modulo 2**32
                             request_ids=[r.request_id for r in requests],
                             token_indices=[len(r.output) + ahead for r in requests],  # resumed: same stream
                             temperatures=[r.temperature for r in requests],
                             greedy=[r.greedy for r in requests])

    def _append(self, seqs: list[Sequence], tokens: np.ndarray,
                logprobs: np.ndarray) -> list[Request]:
        """Give each sequence its new token; finish those that hit eos or a length limit."""
        self.stats.num_generated_tokens += len(seqs)
        finished = []
        for seq, token, logprob in zip(seqs, tokens, logprobs):
            seq.request.output.append(int(token))
            seq.request.logprobs.append(float(logprob))
            reason = self._stop_reason(seq.request)
            if reason is not None:
                finished.append(self._finish(seq, reason))
        return finished

    def _stop_reason(self, request: Request) -> str | None:
        return stop_reason(request, self.eos_ids, self.max_seq_len)

    def _finish(self, seq: Sequence, reason: str) -> Request:
        seq.request.finish_reason = reason
        self._release(seq)
        return seq.request

    def _release(self, seq: Sequence) -> None:
        self.backend.free(seq.slot)
        self.scheduler.release(seq)
