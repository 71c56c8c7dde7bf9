"""Two GPUs: the split mode's weight sync over NCCL, trainer on GPU 0, engine on GPU 1.

Skipped below two GPUs (and without CUDA and CuPy, tests/conftest.py). The timing at the
study's size is `python -m ratchet.bench.two_gpus` (a benchmark, not a test).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def test_cross_gpu_sync_is_bit_equal_to_rounding_the_masters(tmp_path):
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    from ratchet.bench.two_gpus import run

    result = run(str(tmp_path / "sync.json"), repeats=3, small=True)
    assert result["bit_equal_to_rounded_masters"], result["mismatched_tensors"]
    assert result["gpus"] >= 2 and len(result["sync_ms_all"]) == 3
