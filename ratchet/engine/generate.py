"""A batch of requests run to completion: the one loop behind `generate` on every engine (ours
and the vLLM adapter), so both refuse a bad batch before queueing any of it and both show the
user the same progress on long work (an eval of 1,319 problems): requests done and tokens a
second, from the engine's own stats."""

from __future__ import annotations

from typing import Callable

from ratchet.engine.request import Request, check_unique_ids


def run_to_completion(engine, requests: list[Request], queue: Callable[[Request], None],
                      progress: bool = False) -> list[Request]:
    """`requests` through `engine` (its `check_addable`, `step` and `stats`) until every one has
    finished; returns them in the given order. `queue`: the engine's `add` without its check,
    since each request was checked here already (a second check scans the queue again)."""
    pending = set(check_unique_ids(requests))
    for request in requests:  # check all before queueing any
        engine.check_addable(request)
    bar = progress_bar(len(requests)) if progress else None
    generated_before, wall_before = engine.stats.num_generated_tokens, engine.stats.wall_time_s
    try:
        for request in requests:
            queue(request)
        while pending:
            done = [r for r in engine.step() if r.request_id in pending]
            pending.difference_update(r.request_id for r in done)
            if bar is not None:
                tokens = engine.stats.num_generated_tokens - generated_before
                seconds = engine.stats.wall_time_s - wall_before
                bar.set_postfix(tok_s=f"{tokens / max(seconds, 1e-9):.1f}", refresh=False)
                bar.update(len(done))
    except BaseException:  # an error or Ctrl-C mid-batch: leave the engine as it was found
        _cancel(engine, pending)
        raise
    finally:
        if bar is not None:
            bar.close()
    return list(requests)


def _cancel(engine, request_ids) -> None:
    """Cancel what the batch still holds in `engine`, so that a failed `generate` leaves no
    half-started request behind for the next call to trip on (they keep their output, with
    finish_reason None, as a cancel leaves them)."""
    for request_id in sorted(request_ids):
        try:
            engine.cancel(request_id)
        except KeyError:  # never queued, or finished before the error
            pass


def progress_bar(total: int):
    """On the console the user watches (a rule's: its fd 3); redrawn in place on a terminal,
    a line every 5 s elsewhere."""
    from tqdm.auto import tqdm

    from ratchet.progress import console

    out = console()
    tty = hasattr(out, "isatty") and out.isatty()
    return tqdm(total=total, unit="req", desc="generate", dynamic_ncols=True, file=out,
                mininterval=0.1 if tty else 5.0)
