"""dev/vllm_record.py: the vLLM record gathers a bench run, a later run's section over it (named
as such), the decomposition rows and the GPU tests' verdicts."""

from __future__ import annotations

import json
import sys

import pandas as pd
import pytest

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


LOG = """[ablate_decompose_vllm] 0/30 updates (0%)
[ablate_decompose_vllm]   0 updates  cuda  bf16 total            mean 5.73e-03  max 2.64e-01
[ablate_decompose_vllm]   0 updates  vllm  bf16 exact            mean 7.94e-03  max 3.37e-01
[ablate_decompose_vllm] 10/30 updates (33%), 9.0 s/update, ETA 3m00s
[ablate_decompose_vllm]  10 updates  vllm  bf16 total            mean 1.49e-02  max 6.71e-01
"""


def test_a_later_session_lays_renamed_sections_and_a_cut_short_decomposition_over_the_record(tmp_path,
                                                                                              monkeypatch):
    earlier = {"machine": "H200", "commit": "old", "commands": ["a"], "sections_from_other_runs": {},
               "bench": {"eval": {"speedup_vs_vllm": 4.0}, "sensitivity": {"vllm": {"x": 1}}},
               "decompose_vllm": [{"backend": "vllm"}]}
    (tmp_path / "old.json").write_text(json.dumps(earlier))
    (tmp_path / "eval.json").write_text(json.dumps({"eval": {"speedup_vs_vllm": 6.0}}))
    (tmp_path / "bi.json").write_text(json.dumps({"sensitivity": {"vllm": {"x": 0}}}))
    (tmp_path / "d.txt").write_text(LOG)
    out = tmp_path / "r.json"
    monkeypatch.setattr(sys, "argv", ["vllm_record", "--over", str(tmp_path / "old.json"), "--commit", "newcommit",
                                      "--command", "b", "--sections-from", f"eval={tmp_path / 'eval.json'}",
                                      "--sections-from", f"sensitivity_bi={tmp_path / 'bi.json'}:sensitivity",
                                      "--decompose-log", str(tmp_path / "d.txt"), "--out", str(out)])
    vllm_record.main()
    rec = json.loads(out.read_text())
    assert rec["commit"] == "old" and rec["later_commits"] == ["newcommit"] and rec["commands"] == ["a", "b"]
    assert rec["bench"]["headline"]["eval_speedup_vs_vllm"] == 6.0
    assert rec["bench"]["sensitivity"] == {"vllm": {"x": 1}} and rec["bench"]["sensitivity_bi"] == {"vllm": {"x": 0}}
    assert "newcomm" in rec["sections_from_other_runs"]["sensitivity_bi"]
    assert rec["decompose_vllm"] == earlier["decompose_vllm"]
    cut = rec["decompose_vllm_from_log"]
    assert cut["planned_updates"] == 30 and cut["updates_measured"] == [0, 10] and cut["complete"] is False
    assert cut["rows"][2] == {"updates": 10, "backend": "vllm", "engine_dtype": "bf16", "source": "total",
                              "abs_diff_mean": 1.49e-2, "abs_diff_max": 0.671}


def test_the_record_wants_one_base(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "argv", ["vllm_record", "--commit", "c", "--out", str(tmp_path / "r.json")])
    with pytest.raises(SystemExit):
        vllm_record.main()


def test_a_later_whole_table_replaces_its_dtypes_rows_and_the_cut_short_log(tmp_path, monkeypatch):
    row = {"source": "total", "updates": 30, "abs_diff_mean": 1e-3, "abs_diff_p99": 2e-3, "abs_diff_max": 1e-2,
           "kl_k3": 0.0, "num_tokens": 10}
    earlier = {"machine": "H200", "commit": "old", "commands": [], "sections_from_other_runs": {}, "bench": {},
               "decompose_vllm": [{**row, "backend": "vllm", "engine_dtype": d} for d in ("fp16", "bf16")],
               "decompose_vllm_from_log": vllm_record.decomposition_from_log_text(LOG, "cut.txt")}
    (tmp_path / "old.json").write_text(json.dumps(earlier))
    pd.DataFrame([{**row, "backend": "vllm", "engine_dtype": "bf16", "abs_diff_mean": 5e-3}]).to_parquet(
        tmp_path / "bf16.parquet")
    out = tmp_path / "r.json"
    monkeypatch.setattr(sys, "argv", ["vllm_record", "--over", str(tmp_path / "old.json"), "--commit", "new",
                                      "--decompose", str(tmp_path / "bf16.parquet"), "--out", str(out)])
    vllm_record.main()
    rec = json.loads(out.read_text())
    assert [(r["engine_dtype"], r["abs_diff_mean"]) for r in rec["decompose_vllm"]] == [("fp16", 1e-3), ("bf16", 5e-3)]
    assert "decompose_vllm_from_log" not in rec
