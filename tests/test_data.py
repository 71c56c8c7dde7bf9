"""Datasets: the synthetic task, GSM8K (local files, the hub through a fake), split files."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from ratchet.data.datasets_io import COLUMNS, load_split, save_split
from ratchet.data.gsm8k import (GSM8K_REVISION, gsm8k_target, load_gsm8k_hub, load_gsm8k_local,
                                read_gsm8k_file)
from ratchet.data.prompts import GSM8K_SYSTEM, make_prompt_fn, task_prompt
from ratchet.data.reward import has_format, reward
from ratchet.data.synthetic import (ALPHABET, make_arithmetic, problem_space_size,
                                    random_policy_reward)

ROWS = [
    {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3+4=7\n#### 7"},
    {"question": "A car costs $1,200 and a bike $400. Total?", "answer": "1200+400\n#### 1,600"},
    {"question": "It is 5 degrees and drops 12. Now?", "answer": "5-12=-7\n#### -7"},
]


def write_jsonl(path, rows, raw_lines=()):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "".join(raw_lines))
    return path


# ---------------------------------------------------------------- the synthetic task

def operands_of(question):
    return [int(x) for x in question.rstrip("=").split("+")]


def test_synthetic_labels_and_format():
    train, test = make_arithmetic(300, 100, seed=3)
    for df in (train, test):
        assert list(df.columns) == list(COLUMNS)
        assert df["id"].tolist() == list(range(len(df)))
        for question, answer, target in zip(df["question"], df["answer"], df["target"]):
            a, b = operands_of(question)
            assert 0 <= a <= 999 and 0 <= b <= 2 and len(question) == 6  # "037+2="
            assert target == answer == str((a + b) % 10)
            assert set(question) <= set(ALPHABET)
    assert set(train["target"]) == set("0123456789")


def test_synthetic_is_seeded_and_disjoint():
    a_train, a_test = make_arithmetic(500, 200, seed=7)
    b_train, b_test = make_arithmetic(500, 200, seed=7)
    pd.testing.assert_frame_equal(a_train, b_train)
    pd.testing.assert_frame_equal(a_test, b_test)
    c_train, _ = make_arithmetic(500, 200, seed=8)
    assert not a_train["question"].equals(c_train["question"])
    assert a_train["question"].is_unique and a_test["question"].is_unique
    assert not set(a_train["question"]) & set(a_test["question"])


def test_synthetic_small_space_repeats_train_but_keeps_test_apart():
    assert problem_space_size(9, 2) == 100
    train, test = make_arithmetic(400, 20, seed=0, max_operand=9)
    assert len(train) == 400 and test["question"].is_unique
    assert not set(train["question"]) & set(test["question"])
    assert train["question"].nunique() <= 80
    with pytest.raises(ValueError, match="100 distinct prompts cannot hold a test split of 100"):
        make_arithmetic(10, 100, max_operand=9)


def test_synthetic_ops_and_bounds():
    train, _ = make_arithmetic(200, 50, max_operand=99, op="add_nocarry")
    assert problem_space_size(99, 2, "add_nocarry") == 5500
    for question, target in train[["question", "target"]].itertuples(index=False):
        a, b = operands_of(question)
        assert a % 10 + b % 10 < 10 and target == str(a % 10 + b % 10)
    train, _ = make_arithmetic(50, 10, max_operand=(9, 9, 9))
    assert all(len(operands_of(q)) == 3 for q in train["question"])
    with pytest.raises(ValueError, match="unknown op 'mul'"):
        make_arithmetic(10, 10, op="mul")
    with pytest.raises(ValueError, match="at least two operands"):
        make_arithmetic(10, 10, max_operand=(999,))


def test_a_random_policy_gets_some_reward():
    _, test = make_arithmetic(10, 200)
    rate = random_policy_reward(test, max_new_tokens=2, samples=20)
    assert 0.02 < rate < 0.08  # about 1 in 14 first tokens is the right digit


# ---------------------------------------------------------------- GSM8K from local files

def test_real_gsm8k(gsm8k_dir):
    train, test = load_gsm8k_local(gsm8k_dir / "train.jsonl", gsm8k_dir / "test.jsonl")
    assert (len(train), len(test)) == (7473, 1319)
    assert list(train.columns) == list(COLUMNS) and train["id"].is_unique
    assert train["target"].iloc[0] == "72"
    for df in (train, test):
        assert not df["target"].str.contains(",").any()
        assert all(reward(a, t) == 1.0 and has_format(a)
                   for a, t in zip(df["answer"], df["target"]))


def test_real_gsm8k_as_parquet(gsm8k_dir, tmp_path):
    test = read_gsm8k_file(gsm8k_dir / "test.jsonl")
    test[["question", "answer"]].to_parquet(tmp_path / "test.parquet")
    pd.testing.assert_frame_equal(read_gsm8k_file(tmp_path / "test.parquet"), test)


def test_local_jsonl_and_parquet(tmp_path):
    train = read_gsm8k_file(write_jsonl(tmp_path / "train.jsonl", ROWS, ["\n"]))
    assert train["target"].tolist() == ["7", "1600", "-7"]
    assert train["answer"].tolist() == [r["answer"] for r in ROWS]
    pd.DataFrame(ROWS).to_parquet(tmp_path / "test.parquet")
    a, b = load_gsm8k_local(tmp_path / "train.jsonl", tmp_path / "test.parquet")
    pd.testing.assert_frame_equal(a, b)
    assert gsm8k_target("#### 1 ####  2,000 ") == "2000" and gsm8k_target("no marker") is None


def test_a_byte_order_mark_on_the_first_line_is_allowed(tmp_path):
    plain = write_jsonl(tmp_path / "plain.jsonl", ROWS)
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())  # as Windows tools save
    pd.testing.assert_frame_equal(read_gsm8k_file(tmp_path / "bom.jsonl"), read_gsm8k_file(plain))


@pytest.mark.parametrize("make, error, message", [
    (lambda p: p / "absent.jsonl", FileNotFoundError, r"GSM8K file .*absent\.jsonl not found"),
    (lambda p: write_jsonl(p / "empty.jsonl", []), ValueError, r"empty\.jsonl: no rows"),
    (lambda p: write_jsonl(p / "blank.jsonl", [], ["\n", "  \n"]), ValueError,
     r"blank\.jsonl: no rows"),
    (lambda p: write_jsonl(p / "col.jsonl", ROWS[:1] + [{"question": "q?"}]), ValueError,
     r"col\.jsonl line 2: missing column 'answer'"),
    (lambda p: write_jsonl(p / "mark.jsonl", ROWS[:2] + [{"question": "q?", "answer": "so 5"}]),
     ValueError, r"mark\.jsonl line 3: answer has no '####'"),
    (lambda p: write_jsonl(p / "nan.jsonl", [{"question": "q?", "answer": "#### five"}]),
     ValueError, r"nan\.jsonl line 1: the text after '####' is not a number: 'five'"),
    (lambda p: write_jsonl(p / "json.jsonl", ROWS[:1], ["{broken\n"]), ValueError,
     r"json\.jsonl line 2: not valid JSON"),
    (lambda p: write_jsonl(p / "type.jsonl", [{"question": 3, "answer": "#### 3"}]), ValueError,
     r"type\.jsonl line 1: column 'question' is empty or not text"),
    (lambda p: (p / "latin1.jsonl").write_bytes(b'{"question": "q?", "answer": "#### 1"}\n'
                                                 b'{"question": "K\xe4se?", "answer": "#### 2"}\n')
     and p / "latin1.jsonl", ValueError, r"latin1\.jsonl line 2: not UTF-8 text \(byte 0xe4 at column 16\)"),
    (lambda p: (p / "data.csv").write_text("q,a\n") and p / "data.csv", ValueError,
     r"data\.csv: expected a \.jsonl or \.parquet file"),
])
def test_bad_local_files_are_named(tmp_path, make, error, message):
    with pytest.raises(error, match=message):
        read_gsm8k_file(make(tmp_path))


def test_bad_parquet_files_are_named(tmp_path):
    pd.DataFrame({"question": ["q?"]}).to_parquet(tmp_path / "col.parquet")
    with pytest.raises(ValueError, match=r"col\.parquet: missing column\(s\) \['answer'\]"):
        read_gsm8k_file(tmp_path / "col.parquet")
    pd.DataFrame({"question": ["a", "b"], "answer": ["#### 1", "2"]}).to_parquet(
        tmp_path / "m.parquet")
    with pytest.raises(ValueError, match=r"m\.parquet row 1: answer has no '####'"):
        read_gsm8k_file(tmp_path / "m.parquet")
    pd.DataFrame({"question": [], "answer": []}).to_parquet(tmp_path / "empty.parquet")
    with pytest.raises(ValueError, match=r"empty\.parquet: no rows"):
        read_gsm8k_file(tmp_path / "empty.parquet")
    (tmp_path / "junk.parquet").write_text("not parquet")
    with pytest.raises(ValueError, match=r"junk\.parquet: not a readable parquet file"):
        read_gsm8k_file(tmp_path / "junk.parquet")


# ---------------------------------------------------------------- GSM8K from the hub (faked)

class FakeLoadDataset:
    """Stands in for `datasets.load_dataset`: records its call, returns a tiny DatasetDict."""

    def __init__(self, splits=("train", "test"), fail=None):
        self.splits, self.fail, self.calls = splits, fail, []

    def __call__(self, *args, **kwargs):
        import datasets

        self.calls.append((args, kwargs))
        if self.fail:
            raise self.fail
        rows = {"question": [r["question"] for r in ROWS], "answer": [r["answer"] for r in ROWS]}
        return datasets.DatasetDict({s: datasets.Dataset.from_dict(rows) for s in self.splits})


def test_hub_passes_the_revision(monkeypatch):
    import datasets

    fake = FakeLoadDataset()
    monkeypatch.setattr(datasets, "load_dataset", fake)
    train, test = load_gsm8k_hub()
    assert fake.calls == [(("openai/gsm8k", "main"),
                           {"revision": GSM8K_REVISION, "cache_dir": None})]
    assert train["target"].tolist() == ["7", "1600", "-7"] and len(test) == 3
    load_gsm8k_hub("someone/gsm8k-copy", "socratic", revision="abc123")
    assert fake.calls[-1] == (("someone/gsm8k-copy", "socratic"),
                              {"revision": "abc123", "cache_dir": None})


def test_hub_errors_name_the_dataset(monkeypatch):
    import datasets

    monkeypatch.setattr(datasets, "load_dataset", FakeLoadDataset(splits=("train",)))
    with pytest.raises(ValueError,
                       match=r"openai/gsm8k \(main\) at revision .* has no 'test' split"):
        load_gsm8k_hub()
    monkeypatch.setattr(datasets, "load_dataset", FakeLoadDataset(fail=ConnectionError("offline")))
    with pytest.raises(RuntimeError, match=r"cannot load openai/gsm8k \(main\) at revision "
                                           f"{GSM8K_REVISION}: ConnectionError: offline"):
        load_gsm8k_hub()


# ---------------------------------------------------------------- split files

def test_split_round_trip(tmp_path):
    train, _ = make_arithmetic(50, 10)
    path = save_split(train, tmp_path / "splits" / "train.parquet")
    assert [p.name for p in path.parent.iterdir()] == ["train.parquet"]  # no temporary left
    pd.testing.assert_frame_equal(load_split(path), train, check_dtype=False)
    assert load_split(path)["id"].dtype == "int64"


def test_bad_splits_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"absent\.parquet not found"):
        load_split(tmp_path / "absent.parquet")
    pd.DataFrame({"id": [0], "question": ["q"], "answer": ["a"]}).to_parquet(
        tmp_path / "col.parquet")
    with pytest.raises(ValueError, match=r"col\.parquet: missing column\(s\) \['target'\]"):
        load_split(tmp_path / "col.parquet")
    pd.DataFrame({c: [] for c in COLUMNS}).to_parquet(tmp_path / "empty.parquet")
    with pytest.raises(ValueError, match=r"empty\.parquet: the split is empty"):
        load_split(tmp_path / "empty.parquet")
    (tmp_path / "junk.parquet").write_text("junk")
    with pytest.raises(ValueError, match=r"junk\.parquet: not a readable parquet file"):
        load_split(tmp_path / "junk.parquet")
    bad = pd.DataFrame({"id": [0, 0], "question": ["q", "r"], "answer": ["1", "2"],
                        "target": ["1", "2"]})
    with pytest.raises(ValueError, match=r"out\.parquet: id 0 repeats"):
        save_split(bad, tmp_path / "out.parquet")
    assert not (tmp_path / "out.parquet").exists()


# ---------------------------------------------------------------- prompts and the wall

def test_task_prompts():
    user, system = task_prompt("gsm8k", "  How many?\n")
    assert user == "How many?" and system == GSM8K_SYSTEM and "####" in system
    assert task_prompt("arithmetic", "037+2=") == ("037+2=", None)
    with pytest.raises(ValueError, match="unknown task 'chess'"):
        task_prompt("chess", "e4")


class RecordingTokenizer:
    def prompt_ids(self, question, system=None):
        return [question, system]


def test_make_prompt_fn_follows_the_data_source():
    tok = RecordingTokenizer()
    assert make_prompt_fn(tok, "synthetic")("037+2=") == ["037+2=", None]
    assert make_prompt_fn(tok, "hub")(" How many? ") == ["How many?", GSM8K_SYSTEM]
    assert make_prompt_fn(tok, "local")("How many?") == ["How many?", GSM8K_SYSTEM]
    with pytest.raises(ValueError, match="unknown data source 'csv'"):
        make_prompt_fn(tok, "csv")


def test_data_imports_neither_torch_nor_engine_nor_trainer():
    code = ("import sys, ratchet.data.tokenizer, ratchet.data.char_tokenizer, ratchet.data.gsm8k, "
            "ratchet.data.synthetic, ratchet.data.reward, ratchet.data.prompts, "
            "ratchet.data.datasets_io\n"
            "bad = [m for m in sys.modules if m == 'torch' or m.startswith(('ratchet.engine', "
            "'ratchet.trainer', 'transformers'))]\n"
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)
