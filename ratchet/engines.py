"""The one place that picks the engine of a run: ratchet's own (numpy or cuda backend) or
vLLM (`engine.backend: vllm`), both with the surface the stages and the RL loops use. It sits
outside ratchet/engine, whose modules never reach torch, because the vLLM adapter does."""

from __future__ import annotations

from typing import Iterable, Mapping


def make_engine(model, backend: str = "numpy", max_batch_size: int = 64, max_seq_len: int | None = None,
                eos_ids: Iterable[int] | None = None, batch_invariant: bool = False,
                device: int | None = None, vllm_options: Mapping | None = None, **engine_options):
    """An Engine on `backend` ("numpy", "cuda"; resolve "auto" first, ratchet/device.py), or a
    VllmEngine for "vllm" (`vllm_options`: the `engine.vllm` section). `engine_options`: the
    Engine's own (e.g. `overlap`), refused for vLLM."""
    if backend == "vllm":
        if engine_options:
            raise ValueError(f"engine.backend 'vllm' takes none of {sorted(engine_options)}")
        from ratchet.vllm.engine import VllmEngine

        return VllmEngine(model, max_batch_size=max_batch_size, max_seq_len=max_seq_len, eos_ids=eos_ids,
                          batch_invariant=batch_invariant, device=device, options=vllm_options)
    from ratchet.engine.engine import Engine

    return Engine(model, backend=backend, max_batch_size=max_batch_size, max_seq_len=max_seq_len,
                  eos_ids=eos_ids, batch_invariant=batch_invariant, device=device, **engine_options)
