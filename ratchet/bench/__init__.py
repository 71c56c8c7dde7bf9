"""Benchmarks of the engine, apart from it: they import torch and transformers (the
references and the trainer's tensors), which the engine never does, and they use only the
engine's public API.

    python -m ratchet.bench --out bench.json      # one GPU: decode, throughput, engine, hf, sync, sampler
    python -m ratchet.bench.two_gpus --out sync.json   # the split mode's weight sync across two GPUs

The `bench` stage (ratchet/stages/bench.py) runs the first and records its headline figures.
"""
