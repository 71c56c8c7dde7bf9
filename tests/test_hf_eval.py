"""dev.hf_eval, transformers' own greedy eval beside the engine's (issue 20's correctness check
at 1.5B): it loads a GGUF file without `accelerate`, writes its summary, and compares with
the engine's answers problem by problem."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from test_gguf import write_gguf

from dev.hf_eval import compare_with_engine, main
from ratchet.model.convert_gguf import convert_gguf


def answers(ids, responses, rewards) -> pd.DataFrame:
    return pd.DataFrame({"id": ids, "response": responses, "reward": np.asarray(rewards, dtype=float)})


def test_compare_with_engine_pairs_by_problem_id():
    ids = ["a", "b", "c", "d"]
    engine = answers(["d", "c", "b", "a"], ["x", "y", "z", "w"], [1, 0, 1, 0])  # another order
    out = compare_with_engine(engine, ids, ["w", "z", "q", "x"], np.array([0.0, 1.0, 1.0, 1.0]))
    # engine by id: a 0, b 1, c 0, d 1; transformers: a 0, b 1, c 1, d 1
    assert out["engine_accuracy"] == 0.5
    assert out["same_verdict_share"] == 0.75
    assert out["identical_answers_share"] == 0.75  # a, b and d
    assert out["engine_minus_hf"]["diff"] == -0.25
    assert out["engine_minus_hf"]["worse"] == 1 and out["engine_minus_hf"]["better"] == 0
    assert not out["same_verdict_met"]


def test_compare_with_engine_refuses_missing_problems():
    with pytest.raises(ValueError, match="lack 1 of the problems"):
        compare_with_engine(answers(["a"], ["x"], [1]), ["a", "b"], ["x", "y"], np.array([1.0, 0.0]))


def test_hf_eval_runs_on_a_gguf_file_and_compares(tmp_path):
    gguf_path = tmp_path / "tiny.gguf"
    write_gguf(gguf_path, "qwen2")
    model_dir = tmp_path / "model"
    convert_gguf(gguf_path, model_dir)  # ratchet's tokenizer files, as the eval's prompts use them
    test = pd.DataFrame({"id": [10, 11], "question": ["the hell", "a wall"],
                         "target": ["3", "4"], "answer": ["#### 3", "#### 4"]})
    test.to_parquet(tmp_path / "test.parquet")
    engine = answers([11, 10], ["", ""], [0, 0])
    engine.to_parquet(tmp_path / "answers.parquet")
    out = tmp_path / "hf_eval.json"
    assert main(["--source", str(gguf_path), "--model-dir", str(model_dir), "--test", str(tmp_path / "test.parquet"),
                 "--max-new-tokens", "3", "--dtype", "fp32", "--batch-size", "2",
                 "--answers", str(tmp_path / "answers.parquet"), "--out", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert summary["n"] == 2 and summary["device"] == "cpu"
    assert 0 < summary["mean_tokens"] <= 3
    assert summary["accuracy"] == 0.0 and summary["same_verdict_share"] == 1.0
