"""Teacher forcing through the engine: the log-probability of given answers, computed by the
engine's own kernels, as the sampler computed them when it drew the tokens.

    lps = teacher_forced_logprobs(engine, prompts, answers, temperature=1.0, batch_size=16)

This is the trainer's forward with the engine's arithmetic (the "exact" fix of the
ablations, ratchet/mismatch/fix.py): the values are the engine's, the gradient comes from
the torch forward on the same rounded weights. Each answer is replayed in groups of
`batch_size`, prompt first, then one decode step per answer token with the next answer
token forced (`forced` in the backend protocol). On a batch-invariant backend
(`engine.backend.batch_invariant`) a row's bits depend on its own tokens only, so the replay
gives the very log-probabilities of the rollout, although it groups the answers differently:
what is left of the gap is whatever the kernels failed to keep invariant, and the tests and
the ablations measure it rather than assume it is zero.
"""

from __future__ import annotations


def teacher_forced_logprobs(engine, prompts: list[list[int]], answers: list[list[int]],
                            temperature: float = 1.0, batch_size: int | None = None) -> list[list[float]]:
    """float log-probabilities of every answer token (a list per answer, empty for an empty
    answer). `engine` must be idle (no running or waiting request); its slots are left free."""
    if len(prompts) != len(answers):
        raise ValueError(f"teacher forcing: {len(prompts)} prompts for {len(answers)} answers")
    engine.drain("teacher forcing")  # refuses a busy engine; waits for a step launched ahead
    be = engine.backend
    size = min(batch_size or engine.max_batch_size, engine.max_batch_size)
    greedy = temperature == 0
    out: list[list[float]] = [[] for _ in answers]
    todo = [i for i, a in enumerate(answers) if len(a)]
    for begin in range(0, len(todo), size):
        group = todo[begin:begin + size]
        for i in group:
            if len(prompts[i]) + len(answers[i]) > engine.max_seq_len:
                raise ValueError(f"teacher forcing: answer {i} ({len(prompts[i])} + {len(answers[i])} "
                                 f"tokens) is past the engine's max_seq_len {engine.max_seq_len}")
        slots = list(range(len(group)))
        try:
            _, lp = be.prefill_sample(slots, [prompts[i] for i in group], **_params(group, 0, temperature, greedy),
                                      forced=[answers[i][0] for i in group])
            for r, i in enumerate(group):
                out[i].append(float(lp[r]))
            for t in range(1, max(len(answers[i]) for i in group)):
                rows = [r for r, i in enumerate(group) if t < len(answers[i])]
                ids = [group[r] for r in rows]
                _, lp = be.decode_sample([slots[r] for r in rows], [answers[i][t - 1] for i in ids],
                                         [len(prompts[i]) + t - 1 for i in ids], **_params(ids, t, temperature, greedy),
                                         forced=[answers[i][t] for i in ids])
                for r, i in enumerate(ids):
                    out[i].append(float(lp[r]))
        finally:
            for slot in slots:
                be.free(slot)
    return out


def _params(ids: list[int], t: int, temperature: float, greedy: bool) -> dict:
    """Sampling parameters of forced rows: only the temperature and the greedy flag reach the
    log-probability (a forced row's noise is drawn and ignored)."""
    n = len(ids)
    return dict(seeds=[0] * n, request_ids=list(ids), token_indices=[t] * n,
                temperatures=[temperature] * n, greedy=[greedy] * n)
