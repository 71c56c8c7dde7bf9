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
