"""A profile made for a GPU stops at the start on a CPU machine, unless NumPy is asked for by name."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from ratchet import preflight
from ratchet.config import validate
from ratchet.errors import InputError


def _gguf(path, elements: int):
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_tensor("token_embd.weight", np.zeros((elements // 8, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _local(path, backend="auto"):
    return validate({"run_name": "local", "model": {"source": "gguf", "path": str(path)},
                     "data": {"source": "local", "train_path": "a.jsonl", "test_path": "b.jsonl"},
                     "engine": {"backend": backend}})


def test_the_tiny_default_runs_on_numpy():
    preflight.check_device(validate({}), "numpy")


def test_a_large_model_on_numpy_is_refused_with_the_way_to_insist(tmp_path, monkeypatch):
    monkeypatch.setattr(preflight, "CPU_MAX_PARAMS", 1000)
    cfg = _local(_gguf(tmp_path / "m.gguf", 4096))
    assert preflight.estimated_parameters(cfg["model"]) == 4096
    with pytest.raises(InputError, match=r"no CUDA GPU is usable.*engine.backend=numpy"):
        preflight.check_device(cfg, "numpy")
    preflight.check_device(cfg, "cuda")  # a GPU: nothing to refuse
    preflight.check_device(_local(tmp_path / "m.gguf", backend="numpy"), "numpy")  # insisted


def test_a_hub_model_counts_as_large():
    cfg = validate({"run_name": "paper", "model": {"source": "hub"}, "data": {"source": "hub"}})
    with pytest.raises(InputError, match="the hub model Qwen"):
        preflight.check_device(cfg, "numpy")


def test_stages_without_an_engine_run_a_gpu_profile_on_a_cpu(tmp_path, monkeypatch):
    """ablate_learning only compares runs made on GPUs: it must be able to gather them here."""
    from ratchet import cli

    monkeypatch.setattr(preflight, "CPU_MAX_PARAMS", 1000)
    monkeypatch.setattr("ratchet.device.resolve_backend", lambda backend: "numpy")
    cfg = _local(_gguf(tmp_path / "m.gguf", 4096))
    cli._preflight("ablate_learning", cfg)
    cli._preflight("report", cfg)
    with pytest.raises(InputError, match="no CUDA GPU"):
        cli._preflight("ablate_learning_run", cfg)
