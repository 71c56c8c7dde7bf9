"""dev/vllm_record.py: the vLLM record gathers a bench run, a later run's section over it (named
as such), the decomposition rows and the GPU tests' verdicts."""

from __future__ import annotations

import json
import sys

import pandas as pd

from dev import vllm_record


def test_the_record_takes_a_later_section_and_says_so(tmp_path, monkeypatch):
    first = {"device": "H200", "eval": {"speedup_vs_vllm": 4.0}, "update": {"error": "TypeError: x"}}
    later = {"update": {"speedup_vs_vllm": 100.0, "ratchet_ms_median": 2.0}}
    (tmp_path / "a.json").write_text(json.dumps(first))
    (tmp_path / "b.json").write_text(json.dumps(later))
    pd.DataFrame([{"backend": b, "engine_dtype": "fp16", "updates": 1, "source": "total", "abs_diff_mean": 1e-3,
                   "abs_diff_p99": 2e-3, "abs_diff_max": 1e-2, "kl_k3": 0.0, "num_tokens": 10, "extra": 1}
                  for b in ("cuda", "vllm")]).to_parquet(tmp_path / "d.parquet")
    (tmp_path / "p.txt").write_text("PASSED tests/x.py::a\nFAILED tests/x.py::b\n1 passed, 1 failed in 3s\n")
    out = tmp_path / "r.json"
    monkeypatch.setattr(sys, "argv", ["vllm_record", "--bench", str(tmp_path / "a.json"), "--sections-from",
                                      f"update={tmp_path / 'b.json'}", "--decompose", str(tmp_path / "d.parquet"),
                                      "--pytest", str(tmp_path / "p.txt"), "--commit", "abc", "--out", str(out)])
    vllm_record.main()
    rec = json.loads(out.read_text())
    assert rec["bench"]["update"] == later["update"] and "update" in rec["sections_from_other_runs"]
    assert rec["bench"]["headline"]["update_speedup_vs_vllm"] == 100.0
    assert rec["bench"]["headline"]["eval_speedup_vs_vllm"] == 4.0
    assert [r["backend"] for r in rec["decompose_vllm"]] == ["cuda", "vllm"] and "extra" not in rec["decompose_vllm"][0]
    assert rec["gpu_tests"] == [["PASSED", "tests/x.py::a"], ["FAILED", "tests/x.py::b"]]
