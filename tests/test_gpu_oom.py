"""A GPU stage out of memory: one line naming the settings that set its peak, their values and
the GiB the profile states, where a traceback through torch would end (the CLI's exit 3)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ratchet import cli
from ratchet import config as config_mod
from ratchet.gpu_oom import check_gpu_memory, gpu_memory_shortfall, is_gpu_oom, oom_message
from ratchet.stages.registry import GPU_STAGES, memory_knobs

ROOT = Path(__file__).resolve().parents[1]
TORCH_OOM = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.5 GiB"


class OutOfMemoryError(Exception):
    """A class of the same name outside torch and CuPy: not the GPU's memory by its name."""


def test_what_counts_as_the_gpus_memory_running_out():
    assert is_gpu_oom(torch.OutOfMemoryError(TORCH_OOM))
    assert is_gpu_oom(RuntimeError("cudaErrorMemoryAllocation: out of memory"))  # CuPy's runtime error
    assert is_gpu_oom(RuntimeError("the engine process failed: ... CUBLAS_STATUS_ALLOC_FAILED"))
    assert is_gpu_oom(RuntimeError("engine: OutOfMemoryError: Out of memory allocating 2,048 bytes"))  # CuPy's, relayed
    try:  # raised from one, as the split trainer re-raises its engine thread's error
        try:
            raise torch.OutOfMemoryError(TORCH_OOM)
        except torch.OutOfMemoryError as inner:
            raise RuntimeError("the engine thread failed") from inner
    except RuntimeError as outer:
        assert is_gpu_oom(outer)
    assert not is_gpu_oom(RuntimeError("shape mismatch"))
    assert not is_gpu_oom(OutOfMemoryError("a host-side pool of our own"))
    assert not is_gpu_oom(MemoryError())  # the host's memory: Python's own error is clear
    assert not is_gpu_oom(None)


def test_every_gpu_stage_names_settings_that_exist():
    cfg = config_mod.load(ROOT / "config" / "local.yaml")
    for stage in GPU_STAGES:
        knobs = memory_knobs(stage)
        assert knobs, stage
        for key in knobs:
            node = cfg
            for part in key.split("."):
                assert part in node, (stage, key)
                node = node[part]
    assert memory_knobs("report") == ()


def test_the_message_names_the_values_and_the_stated_memory():
    cfg = config_mod.load(ROOT / "config" / "local.yaml", ["train.micro_batch_tokens=6000"])
    line = oom_message("train_split", cfg, torch.OutOfMemoryError(TORCH_OOM + "\nmore lines"))
    assert line.startswith(f"train_split ran out of GPU memory ({TORCH_OOM}).")
    assert "train.micro_batch_tokens=6000, train.micro_batch_size=64" in line
    assert "say train.micro_batch_tokens=3000" in line
    assert f"states {cfg['gpu_memory_gib']['train_split']:g} GiB" in line and "\n" not in line
    tiny = config_mod.load(ROOT / "config" / "config.yaml")  # tokens unset: the example is the next one
    line = oom_message("ablate_fix_run", tiny, torch.OutOfMemoryError(TORCH_OOM))
    assert "ablate.micro_batch_tokens=null" in line and f"ablate.micro_batch_size={tiny['ablate']['micro_batch_size'] // 2}" in line


def _cli_raising(monkeypatch, error: BaseException) -> None:
    def run_stage(*args, **kwargs):
        raise error

    monkeypatch.setattr(cli, "run_stage", run_stage)
    monkeypatch.setattr(cli, "_preflight", lambda *a: None)
    monkeypatch.setattr(cli, "claim_gpus_for", lambda *a: None)


def test_the_cli_says_it_in_one_line_and_exits_3(tmp_path, monkeypatch, capsys):
    _cli_raising(monkeypatch, torch.OutOfMemoryError(TORCH_OOM))
    rc = cli.main(["verify", "--config", str(ROOT / "config" / "local.yaml"), f"results_dir={tmp_path}"])
    err = capsys.readouterr().err
    assert rc == 3 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("ratchet: verify ran out of GPU memory (CUDA out of memory.") and "train.micro_batch_tokens=8192" in err


def test_any_other_error_keeps_its_traceback(tmp_path, monkeypatch):
    _cli_raising(monkeypatch, RuntimeError("shape mismatch"))
    with pytest.raises(RuntimeError, match="shape mismatch"):
        cli.main(["verify", "--config", str(ROOT / "config" / "local.yaml"), f"results_dir={tmp_path}"])


def test_a_gpu_smaller_than_the_stated_peaks_is_said_at_the_start():
    """The pipeline's start (workflow/rules/common.smk) warns where the largest GPU has less
    memory than the profile states for some GPU rules, naming them and the settings to lower."""
    cfg = config_mod.load(ROOT / "config" / "local.yaml")
    said = gpu_memory_shortfall(cfg, {"0": 23.6})
    stated = cfg["gpu_memory_gib"]
    assert said.startswith("the largest GPU here has 24 GiB, and the profile states more for ablate_decompose_vllm 80, "
                           f"ablate_decompose {stated['ablate_decompose']:g}, ")
    assert "eval_baseline" not in said and "build_engine" not in said  # 10 and 15 GiB fit
    assert "ablate.micro_batch_tokens or engine.vllm.gpu_memory_utilization or train.micro_batch_tokens" in said
    assert gpu_memory_shortfall(cfg, {"0": 139.8, "1": 23.6}) is None  # the largest fits them all
    one_job = {**cfg, "gpu_memory_gib": {**stated, "ablate_fix_run-exact": 150}}  # a job stated alone
    assert "ablate_fix_run-exact 150" in gpu_memory_shortfall(one_job, {"0": 139.8})
    assert gpu_memory_shortfall(cfg, {}) is None  # nothing known (no nvidia-smi)
    assert gpu_memory_shortfall(config_mod.load(ROOT / "config" / "config.yaml"), {"0": 8.0}) is None  # none stated
    assert check_gpu_memory(cfg, "numpy") is None  # a CPU run: no GPU to compare
    # the rules this run starts, where known: an on-demand rule not among them is not named
    ran = {"train_colocated", "train_split", "ablate_decompose", "ablate_fix_run", "eval_baseline"}
    said = gpu_memory_shortfall(cfg, {"0": 79.6}, ran)
    assert said is None  # the H100 80GB: every rule of `all` fits; ablate_decompose_vllm (80) is not run
    assert "ablate_decompose_vllm 80" in gpu_memory_shortfall(cfg, {"0": 79.6})  # all rules: it is
    assert "ablate_decompose_vllm" in gpu_memory_shortfall(cfg, {"0": 79.6}, ran | {"ablate_decompose_vllm"})
    said = gpu_memory_shortfall(one_job, {"0": 139.8}, ran)
    assert "ablate_fix_run-exact 150" in said  # a job's own statement, by its rule
    assert gpu_memory_shortfall(one_job, {"0": 139.8}, ran - {"ablate_fix_run"}) is None

