"""python -m ratchet.bench answers --help and refuses a wrong section anywhere, and without
CuPy or a GPU says what it needs instead of a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ratchet.device import cuda_available


def bench(*args):
    return subprocess.run([sys.executable, "-m", "ratchet.bench", *args], capture_output=True, text=True, check=False,
                          timeout=120)


def test_help_and_a_wrong_section_need_no_gpu():
    assert bench("--help").returncode == 0
    wrong = bench("--sections", "decode,nope")
    assert wrong.returncode == 2 and "['nope'] not among decode" in wrong.stderr


@pytest.mark.skipif(cuda_available(), reason="a GPU is here: the bench would run")
def test_without_a_gpu_it_says_what_it_needs(tmp_path):
    out = bench("--sections", "sync", "--out", str(tmp_path / "b.json"))
    assert out.returncode == 1 and "needs CuPy and a CUDA GPU" in out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "b.json").exists()


def test_the_headline_sync_is_the_flat_call_beside_the_mapping_and_the_kernels_alone():
    """sync_ms is the call training makes (FlatWeights); the mapping's call, the kernel alone
    and torch's copy alone beside it; a section that failed leaves them empty."""
    from ratchet.bench.headline import headline

    res = {"sync": {"inplace_s": 1.1e-3, "inplace_flat_s": 0.9e-3,
                    "inplace_flat_events_ms (update_weights call, FlatWeights, GPU clock)": 0.8,
                    "kernels_alone_ms": {"convert_tiles, 2 loads": 0.7, "torch_flat_copy": 0.69}}}
    h = headline(res)
    assert h["sync_ms"] == pytest.approx(0.9) and h["sync_mapping_ms"] == pytest.approx(1.1)
    assert h["sync_events_ms"] == 0.8 and h["sync_kernel_ms"] == 0.7 and h["torch_copy_kernel_ms"] == 0.69
    empty = headline({"sync": {"error": "RuntimeError: x"}})
    assert empty["sync_ms"] is None and empty["sync_kernel_ms"] is None
