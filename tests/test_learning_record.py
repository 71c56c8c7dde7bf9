"""dev/learning_record.py: issue 21's record from the parts GPU sessions bring back; a part
not given is named as missing, and a folder without the comparison's outputs is refused."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from dev import learning_record


def test_the_parts_given_are_kept_and_the_others_named_missing(tmp_path):
    ablate = tmp_path / "ablate"
    ablate.mkdir()
    (ablate / "learning_summary.json").write_text(json.dumps({"learning_steps": 100}))
    pd.DataFrame([{"dtype": "fp16", "remedy": "none", "accuracy": 0.3}]).to_parquet(ablate / "learning.parquet")
    pd.DataFrame([{"dtype": "fp16", "a": "none", "b": "fix", "diff": 0.01}]).to_parquet(ablate / "learning_diffs.parquet")
    (tmp_path / "g.json").write_text(json.dumps({"commit": "c1", "command": "x", "gradient_table": {"fp16": {}}}))
    out = tmp_path / "r.json"
    learning_record.main(["--learning", str(ablate), "--gradient", str(tmp_path / "g.json"), "--commit", "c2",
                          "--out", str(out)])
    rec = json.loads(out.read_text())
    assert rec["parts_missing"] == ["grid_conditions"] and rec["commit"] == "c2"
    assert rec["learning"]["summary"] == {"learning_steps": 100}
    assert rec["learning"]["runs"] == [{"dtype": "fp16", "remedy": "none", "accuracy": 0.3}]
    assert rec["learning"]["differences"][0]["b"] == "fix"
    assert rec["gradient"] == {"table": {"fp16": {}}, "commit": "c1", "command": "x"}
    # the local profile asks for 10 runs: the one given is present, the nine others named missing
    assert rec["learning"]["runs_present"] == ["fp16-none"] and len(rec["learning"]["runs_asked"]) == 10
    assert rec["learning_runs_missing"] == [r for r in rec["learning"]["runs_asked"] if r != "fp16-none"]


def test_a_comparison_of_every_asked_run_misses_none_and_keeps_its_commit(tmp_path):
    ablate = tmp_path / "ablate"
    ablate.mkdir()
    (ablate / "learning_summary.json").write_text("{}")
    (ablate / "commit").write_text("abc123\n")
    runs = [{"dtype": d, "remedy": r} for d in ("fp16", "bf16") for r in ("none", "tis", "mis", "fix", "exact")]
    pd.DataFrame(runs).to_parquet(ablate / "learning.parquet")
    pd.DataFrame([{"dtype": "fp16", "a": "none", "b": "fix"}]).to_parquet(ablate / "learning_diffs.parquet")
    out = tmp_path / "r.json"
    learning_record.main(["--learning", str(ablate), "--commit", "c", "--out", str(out)])
    rec = json.loads(out.read_text())
    assert rec["learning_runs_missing"] == [] and rec["learning"]["commit"] == "abc123"


def test_a_folder_without_the_comparison_is_refused_by_name(tmp_path):
    with pytest.raises(SystemExit, match="no learning_summary.json"):
        learning_record.main(["--learning", str(tmp_path), "--commit", "c", "--out", str(tmp_path / "r.json")])
    assert not (tmp_path / "r.json").exists()


def test_a_record_without_a_gradient_table_is_refused(tmp_path):
    (tmp_path / "g.json").write_text(json.dumps({"commit": "c"}))
    with pytest.raises(SystemExit, match="no gradient_table"):
        learning_record.main(["--gradient", str(tmp_path / "g.json"), "--commit", "c", "--out", str(tmp_path / "r.json")])


def _run_folder(root, dtype, remedy, start, final):
    """One ablate_learning_run's folder: its per-step rows and its answers at steps 0 and 10."""
    d = root / f"{dtype}-{remedy}"
    d.mkdir(parents=True)
    answers = pd.concat([pd.DataFrame({"step": s, "id": range(len(c)), "correct": c, "num_tokens": 10,
                                       "dtype": dtype, "remedy": remedy}) for s, c in ((0, start), (10, final))])
    answers.to_parquet(d / "answers.parquet")
    pd.DataFrame({"step": range(10), "reward": 0.5, "dtype": dtype, "remedy": remedy}).to_parquet(d / "steps.parquet")
    return d


def test_runs_from_two_sessions_are_compared_as_the_pipeline_would_and_the_absent_named(tmp_path):
    import numpy as np

    rng = np.random.default_rng(0)
    start = rng.random(400) < 0.25
    finals = {"none": start | (rng.random(400) < 0.02), "fix": start | (rng.random(400) < 0.3)}
    runs = [_run_folder(tmp_path / "session5", "fp16", "none", start, finals["none"]),
            _run_folder(tmp_path / "session6", "fp16", "fix", start, finals["fix"])]
    into, out = tmp_path / "compared", tmp_path / "r.json"
    learning_record.main(["--runs", *map(str, runs), "--learning", str(into), "--commit", "c", "--out", str(out)])
    rec = json.loads(out.read_text())
    assert rec["learning"]["runs_present"] == ["fp16-none", "fp16-fix"]
    assert [r["accuracy"] for r in rec["learning"]["runs"]] == pytest.approx([finals["none"].mean(), finals["fix"].mean()])
    diff = rec["learning"]["differences"][0]
    assert (diff["a"], diff["b"]) == ("none", "fix") and diff["established"]
    assert diff["diff"] == pytest.approx(finals["fix"].mean() - finals["none"].mean())
    assert len(rec["learning_runs_missing"]) == 8 and "bf16-exact" in rec["learning_runs_missing"]
    assert (into / "learning.png").stat().st_size > 0 and not (into / "ablate").exists()


def test_a_run_folder_without_its_answers_is_refused_by_name(tmp_path):
    d = tmp_path / "fp16-none"
    d.mkdir()
    pd.DataFrame({"step": [0]}).to_parquet(d / "steps.parquet")
    with pytest.raises(SystemExit, match="fp16-none: no answers.parquet"):
        learning_record.main(["--runs", str(d), "--learning", str(tmp_path / "c"), "--commit", "c",
                              "--out", str(tmp_path / "r.json")])
    assert not (tmp_path / "r.json").exists()
