"""An engine's steps timed one by one, as the product runs them (no CuPy here: the vLLM bench
times ratchet's NumPy engine with it on a CPU too)."""

from __future__ import annotations

import time


def timed_steps(engine, requests) -> tuple[float, list[float], float]:
    """`requests` added, then `Engine.step` until all finish: (the first step's seconds
    (admission, prefill, graph capture), each later step's, the later steps' wall)."""
    for r in requests:
        engine.add(r)
    t = time.perf_counter()
    engine.step()
    first = time.perf_counter() - t
    steps, start = [], time.perf_counter()
    while engine.num_unfinished:
        t = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - t)
    return first, steps, time.perf_counter() - start
