"""Stages on their own: the real hub download path offline, bad model inputs, and the engine
against the trainer on the same sampled tokens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ratchet.data.char_tokenizer import save_char_tokenizer
from ratchet.data.synthetic import ALPHABET
from ratchet.model.tiny import make_tiny_model

REVISION = "0123456789abcdef0123456789abcdef01234567"


def ratchet(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "RATCHET_TRACKING": "off", **(env or {})}
    full_env.pop("RATCHET_PIPELINE_ID", None)
    return subprocess.run([sys.executable, "-m", "ratchet", *args], capture_output=True,
                          text=True, env=full_env, timeout=300)


def hub_cache_with_tiny_model(root: Path) -> Path:
    """A Hugging Face cache laid out as the hub's, holding org/tiny at REVISION."""
    repo = root / "models--org--tiny"
    snapshot = repo / "snapshots" / REVISION
    save_char_tokenizer(root / "tok", ALPHABET)
    make_tiny_model(snapshot, seed=3, vocab_size=len(ALPHABET) + 2, hidden_size=32,
                    intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                    tokenizer_dir=root / "tok", eos_token_id=1, pad_token_id=0)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(REVISION)
    return root


def hub_args(results: Path) -> list[str]:
    return [f"results_dir={results}", "run_name=hubtest", "model.source=hub",
            "model.repo_id=org/tiny", f"model.revision={REVISION}", "data.source=local",
            "data.train_path=unused.jsonl", "data.test_path=unused.jsonl", "engine.dtype=fp32"]


def test_hub_download_path_offline_then_convert(tmp_path):
    cache = hub_cache_with_tiny_model(tmp_path / "hub")
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}
    results = tmp_path / "results"
    proc = ratchet("download_model", *hub_args(results), env=env)
    assert proc.returncode == 0, proc.stderr
    record = json.loads((results / "hubtest" / "source" / "source.json").read_text())
    assert record["kind"] == "hf" and record["revision"] == REVISION
    assert Path(record["path"]) == cache / "models--org--tiny" / "snapshots" / REVISION

    proc = ratchet("convert_weights", *hub_args(results), env=env)
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((results / "hubtest" / "model" / "manifest.json").read_text())
    assert manifest["dtype"] == "fp32" and "layers.0.wqkv.weight" in manifest["tensors"]


def test_hub_revision_missing_from_cache_is_named(tmp_path):
    cache = hub_cache_with_tiny_model(tmp_path / "hub")
    args = hub_args(tmp_path / "results")
    args[4] = "model.revision=" + "f" * 40
    proc = ratchet("download_model", *args, env={"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)})
    assert proc.returncode != 0
    assert "org/tiny@" + "f" * 40 in proc.stderr
    assert not (tmp_path / "results" / "hubtest" / "source" / "source.json").exists()


def test_missing_model_directory_is_named(tmp_path):
    missing = tmp_path / "no-such-model"
    proc = ratchet("download_model", f"results_dir={tmp_path / 'results'}", "run_name=x",
                   "model.source=local", f"model.path={missing}", "data.source=local",
                   "data.train_path=a.jsonl", "data.test_path=b.jsonl")
    assert proc.returncode != 0
    assert str(missing) in proc.stderr and "model directory not found" in proc.stderr
    assert not (tmp_path / "results" / "x" / "source" / "source.json").exists()


def test_unknown_key_on_the_command_line_is_named(tmp_path):
    proc = ratchet("download_data", f"results_dir={tmp_path}", "data.sourc=hub")
    assert proc.returncode == 2 and "unknown key 'data.sourc'" in proc.stderr


@pytest.fixture(scope="module")
def tiny_engine_model(tmp_path_factory):
    from ratchet.model.convert_hf import convert_hf

    root = tmp_path_factory.mktemp("tiny")
    save_char_tokenizer(root / "tok", ALPHABET)
    make_tiny_model(root / "hf", seed=5, vocab_size=len(ALPHABET) + 2, hidden_size=64,
                    intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                    init_std=0.2, tokenizer_dir=root / "tok", eos_token_id=1, pad_token_id=0)
    return convert_hf(root / "hf")


def _engine_vs_trainer(model_cfg, weights, dtype):
    from ratchet.engine.engine import Engine
    from ratchet.mismatch.compare import compare, random_prompts, sample
    from ratchet.model.dtypes import round_to
    from ratchet.model.io import EngineModel
    from ratchet.trainer.policy import Policy

    rounded = {k: round_to(v, dtype) for k, v in weights.items()}
    prompts = random_prompts(model_cfg.vocab_size, 16, 8, seed=1, avoid=(0, 1))
    # no EOS stop: every request yields its full 64 tokens (1,024 in all)
    reqs = sample(Engine(EngineModel(model_cfg, rounded, dtype), max_batch_size=16,
                         max_seq_len=128, eos_ids=()), prompts, 64, seed=7)
    assert sum(len(r.output) for r in reqs) == 16 * 64
    masters = Policy.from_weights(model_cfg, weights)      # the trainer's fp32 masters
    return {
        "masters": compare(masters, reqs),
        "engine_weights": compare(masters, reqs, weight_dtype=dtype),
    }


def test_engine_fp32_matches_trainer_on_sampled_tokens(tiny_engine_model):
    gaps = _engine_vs_trainer(*tiny_engine_model, "fp32")
    gap = gaps["masters"]["mismatch/logprob_abs_diff_max"]
    print(f"numpy engine fp32 vs trainer fp32: max |dlogp| {gap:.2e}")
    assert gap <= 1e-5


def test_engine_fp16_gap_is_measured_not_hidden(tiny_engine_model):
    gaps = _engine_vs_trainer(*tiny_engine_model, "fp16")
    masters = gaps["masters"]["mismatch/logprob_abs_diff_max"]
    same = gaps["engine_weights"]["mismatch/logprob_abs_diff_max"]
    print(f"numpy engine fp16 vs trainer: max |dlogp| {masters:.2e} against fp32 masters, "
          f"{same:.2e} against the trainer on fp16-rounded weights")
    # rounding the weights is most of the gap; fp16 activations in the engine are the rest
    assert masters > 1e-5 and same < masters


def test_verify_refuses_trainings_made_under_other_settings(tmp_path):
    """Run by hand after a config edit, verify reran the steps under the new settings and
    reported the difference as non-determinism (`DIVERGES at step 0`)."""
    from ratchet.config import validate
    from ratchet.errors import InputError
    from ratchet.paths import RunPaths
    from ratchet.stages.guard import write_stamp
    from ratchet.stages.verify import check_same_training

    trained = validate({"results_dir": str(tmp_path), "train": {"lr": 2e-3}})
    paths = RunPaths.from_config(trained)
    check_same_training(trained, paths)  # no stamps: made outside the pipeline, nothing to compare
    for mode in ("colocated", "split"):
        write_stamp(f"train_{mode}", trained)
    check_same_training(trained, paths)
    # what the reruns do not depend on may differ
    check_same_training(validate({"results_dir": str(tmp_path), "train": {"lr": 2e-3, "steps": 3, "verify_steps": 1},
                                  "eval": {"num_problems": 5}}), paths)
    with pytest.raises(InputError, match=r"verify: .*colocated.*made under other settings "
                                         r"\(train\.lr: 0\.002 -> 0\.001\); rerun train_colocated"):
        check_same_training(validate({"results_dir": str(tmp_path), "train": {"lr": 1e-3}}), paths)
