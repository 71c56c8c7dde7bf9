"""Teacher forcing, `Engine.score`: the log-probability of given answers by the engine's own
kernels, as its sampler computed them when it drew the tokens (the ablations' "exact" fix);
on a batch-invariant engine, the rollout's very bits however the answers are grouped."""

from __future__ import annotations

from ratchet.engine.request import check_scorable
from ratchet.engine.sampling import SamplingBatch


def teacher_forced_logprobs(engine, prompts: list[list[int]], answers: list[list[int]],
                            temperature: float = 1.0, batch_size: int | None = None) -> list[list[float]]:
    """float log-probabilities of every answer token (a list per answer, empty for an empty
    answer): in groups of `batch_size`, each prompt prefilled, then one decode step per answer
    token with the next one forced. `engine` must be idle; its slots are left free."""
    check_scorable(prompts, answers, engine.cfg.vocab_size, engine.max_seq_len)
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"teacher forcing: batch_size must be >= 1 (or None: the engine's "
                         f"{engine.max_batch_size}), got {batch_size}")
    engine.drain("teacher forcing")  # refuses a busy engine; waits for a step launched ahead
    be = engine.backend
    size = min(batch_size or engine.max_batch_size, engine.max_batch_size)
    out: list[list[float]] = [[] for _ in answers]
    todo = [i for i, a in enumerate(answers) if len(a)]
    for begin in range(0, len(todo), size):
        group = todo[begin:begin + size]
        slots = list(range(len(group)))
        try:
            _, lp = be.prefill_sample(slots, [prompts[i] for i in group],
                                      _forced_batch(group, 0, temperature, [answers[i][0] for i in group]))
            for r, i in enumerate(group):
                out[i].append(float(lp[r]))
            for t in range(1, max(len(answers[i]) for i in group)):
                rows = [r for r, i in enumerate(group) if t < len(answers[i])]
                ids = [group[r] for r in rows]
                _, lp = be.decode_sample([slots[r] for r in rows], [answers[i][t - 1] for i in ids],
                                         [len(prompts[i]) + t - 1 for i in ids],
                                         _forced_batch(ids, t, temperature, [answers[i][t] for i in ids]))
                for r, i in enumerate(ids):
                    out[i].append(float(lp[r]))
        finally:
            for slot in slots:
                be.free(slot)
    return out


def _forced_batch(ids: list[int], t: int, temperature: float, forced: list[int]) -> SamplingBatch:
    """Rows forced to the answers' tokens: only the temperature and the greedy flag reach the
    log-probability (a forced row's noise is drawn and ignored)."""
    n = len(ids)
    return SamplingBatch(seeds=[0] * n, request_ids=list(ids), token_indices=[t] * n,
                         temperatures=[temperature] * n, greedy=[temperature == 0] * n, forced=forced)
