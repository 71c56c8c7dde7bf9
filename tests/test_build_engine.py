"""build_engine's verdict: the engine against the trainer in the engine's own arithmetic class.
The fp32 comparison also holds the arithmetic's own gap (on Qwen2.5-0.5B it passes an fp16
engine's whole tolerance on some seeds): it is reported, not judged."""

from __future__ import annotations

import json

import pytest

from ratchet.paths import RunPaths
from ratchet.stages.build_engine import TOLERANCE, VERDICT


def _gaps(fp32: float, autocast: float):
    """A stand-in for mismatch.compare: `fp32` without autocast, `autocast` with it."""
    from ratchet.mismatch import compare as compare_mod

    real = compare_mod.compare

    def compare(policy, reqs, compute_dtype="fp32", prefix=""):
        out = real(policy, reqs, compute_dtype=compute_dtype, prefix=prefix)
        out[prefix + "logprob_abs_diff_mean"] = fp32 if compute_dtype == "fp32" else autocast
        return out

    return compare


def test_the_verdict_is_the_engines_own_arithmetic(tmp_path, prepare, monkeypatch):
    from ratchet.mismatch import compare as compare_mod
    from ratchet.stages import run_stage

    cfg = prepare(tmp_path / "results")
    dtype = cfg["engine"]["dtype"]
    assert dtype != "fp32" and VERDICT[dtype] == f"{dtype}_autocast"
    tol = TOLERANCE[dtype]
    # the fp32 arithmetic beyond the tolerance, the engine's own class within it: built
    monkeypatch.setattr(compare_mod, "compare", _gaps(fp32=2 * tol, autocast=tol / 4))
    run_stage("build_engine", cfg)
    record = json.loads(RunPaths.from_config(cfg).build.read_text())["selftest"]
    assert record["passed"] and record["verdict"] == f"{dtype}_autocast"
    assert record["trainer_variants"]["fp32_arithmetic"]["selftest/logprob_abs_diff_mean"] == 2 * tol
    # the engine's own class beyond it: one error that says which comparison failed
    monkeypatch.setattr(compare_mod, "compare", _gaps(fp32=tol / 4, autocast=2 * tol))
    with pytest.raises(RuntimeError, match=rf"\({dtype}_autocast\): mean \|dlogp\|"):
        run_stage("build_engine", cfg)
