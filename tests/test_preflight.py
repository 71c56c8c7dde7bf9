"""A profile made for a GPU stops at the start on a CPU machine, unless NumPy is asked for by name."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from ratchet import preflight
from ratchet.config import validate
from ratchet.errors import InputError


def _gguf(path, elements: int):
    """A GGUF file of one fp32 tensor of zeros: its header written, its data a hole the file's
    length leaves (a sparse file, the bytes add_tensor writes: a 1.78B model's 7 GB cost
    neither the disk nor the time)."""
    shape = (elements // 8, 8)
    nbytes = shape[0] * shape[1] * np.dtype(np.float32).itemsize
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_tensor_info("token_embd.weight", shape, np.dtype(np.float32), nbytes)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    with open(path, "r+b") as f:
        data_start = -(-f.seek(0, 2) // writer.data_alignment) * writer.data_alignment
        f.truncate(data_start + nbytes)
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


def test_a_model_path_under_home_is_read_as_download_model_reads_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    _gguf(tmp_path / "m.gguf", 4096)
    assert preflight.estimated_parameters(_local("~/m.gguf")["model"]) == 4096  # None before: "not found"


def test_a_local_model_path_that_is_a_file_is_not_called_missing(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"x")
    cfg = validate({"run_name": "local", "model": {"source": "local", "path": str(tmp_path / "weights.bin")},
                    "data": {"source": "local", "train_path": "a.jsonl", "test_path": "b.jsonl"}})
    with pytest.raises(InputError, match=r"weights\.bin \(no \*\.safetensors directory, so of unknown size\)"):
        preflight.check_device(cfg, "numpy")


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


def _trained(cfg, **train):
    cfg["train"].update(train)
    return cfg


def test_checkpoints_the_disk_cannot_hold_are_refused_before_training(tmp_path):
    """1.78B parameters (Coder-1.5B, untied), 100 steps, a checkpoint every 50, the newest 2 kept:
    colocated holds 2 at the peak (it saves twice), 21.4 GB each; on a 30 GB disk it is refused,
    naming the settings; kept to 0, nothing is written and nothing is checked."""
    cfg = _trained(_local(_gguf(tmp_path / "m.gguf", 1_777_088_000)), steps=100, checkpoint_every=50,
                   keep_checkpoints=2)
    per, held = preflight.checkpoint_plan(cfg, "colocated", 1_777_088_000)
    assert (per, held) == (1_777_088_000 * 12, 2)
    assert preflight.checkpoint_plan(cfg, "split", 1_777_088_000) == (1_777_088_000 * 14, 2)  # + the fp16 engine copy
    with pytest.raises(InputError, match=r"train_colocated: its checkpoints need 42\.7 GB .*30\.0 GB are free"
                                         r".*train\.keep_checkpoints.*train\.checkpoint_every"):
        preflight.check_checkpoint_disk(cfg, "colocated", tmp_path / "ckpt", free_bytes=30_000_000_000)
    preflight.check_checkpoint_disk(cfg, "colocated", tmp_path / "ckpt", free_bytes=50_000_000_000)
    preflight.check_checkpoint_disk(_trained(cfg, keep_checkpoints=0), "colocated", tmp_path / "ckpt", free_bytes=0)


def test_checkpoints_already_written_count_as_held(tmp_path):
    from ratchet.rl.checkpoint import STATE_FILE

    cfg = _trained(_local(_gguf(tmp_path / "m.gguf", 1_000_000)), steps=100, checkpoint_every=10, keep_checkpoints=2)
    assert preflight.checkpoint_plan(cfg, "colocated", 1_000_000)[1] == 3  # keep + 1 while the newest is written
    root = tmp_path / "ckpt"
    for step in (10, 20):
        (root / f"step-{step}").mkdir(parents=True)
        (root / f"step-{step}" / STATE_FILE).write_text("{}")
    preflight.check_checkpoint_disk(cfg, "colocated", root, free_bytes=12_000_000)  # one more: 12 MB
    with pytest.raises(InputError):
        preflight.check_checkpoint_disk(cfg, "colocated", tmp_path / "fresh", free_bytes=12_000_000)


@pytest.mark.parametrize("mode", ["colocated", "split"])
def test_a_training_kept_to_no_checkpoints_writes_none_and_one_that_keeps_them_does(tmp_path, monkeypatch, prepare,
                                                                                   mode):
    from ratchet.paths import RunPaths
    from ratchet.rl.checkpoint import list_checkpoints
    from ratchet.stages import run_stage

    monkeypatch.setenv("RATCHET_TRACKING", "off")
    for keep, expected in ((0, 0), (1, 1)):
        cfg = prepare(tmp_path / f"keep{keep}", "train.steps=4", "train.checkpoint_every=2", "train.eval_every=0",
                      f"train.keep_checkpoints={keep}")
        run_stage(f"train_{mode}", cfg)
        paths = RunPaths.from_config(cfg)
        assert paths.train_summary(mode).is_file()
        assert len(list_checkpoints(paths.train_dir(mode) / "checkpoints")) == expected
