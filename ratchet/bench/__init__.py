"""Benchmarks of the engine, apart from it: they import torch and transformers (the references,
the trainer's tensors), which the engine never does, and use only its public API.
`python -m ratchet.bench --out bench.json` (one GPU; the `bench` stage runs it) and
`python -m ratchet.bench.two_gpus --out sync.json` (the split mode's sync across two GPUs)."""
