"""The vLLM side-by-side bench (ratchet/bench/vs_vllm.py) on the CPU: ratchet's NumPy engine
beside the fake vLLM (tests/fake_vllm.py), so that its sections run before a GPU does."""

from __future__ import annotations

import fake_vllm
import numpy as np
import pytest
from random_model import FakeModel, random_weights
from test_engine import tiny_config

from ratchet.bench import vs_vllm
from ratchet.engines import make_engine


@pytest.fixture
def model():
    cfg = tiny_config(False, eos_token_ids=[])
    return FakeModel(cfg, random_weights(cfg, seed=5, dtype="fp16"), "fp16")


@pytest.fixture
def vllm_engine(monkeypatch, model):
    fake_vllm.FakeLLM.instances.clear()
    fake_vllm.install(monkeypatch)
    return make_engine(model, backend="vllm", max_batch_size=8, max_seq_len=64, eos_ids=[])


def test_decode_times_both_engines_on_the_same_prompts(model, vllm_engine):
    out = vs_vllm.bench_decode(model, vllm_engine.llm, batches=(4,), prompt_len=5, new_tokens=6, backend="numpy")
    row = out["b4"]
    assert row["ratchet"]["step_ms_median"] > 0 and row["vllm_seeded"]["step_ms_median"] > 0
    added = vllm_engine.llm.llm_engine.added
    assert len(added) == 8 and [a[1] for a in added[:4]] == [a[1] for a in added[4:]]  # same prompts both ways
    assert [a[2].seed is None for a in added] == [False] * 4 + [True] * 4
    assert all(a[2].max_tokens == a[2].min_tokens == 6 and a[2].logprobs == 0 for a in added)


def test_update_hands_vllm_every_tensor(model, vllm_engine):
    out = vs_vllm.bench_update(model, vllm_engine, repeats=2, backend="numpy")
    assert out["params"] == sum(np.size(w) for w in model.weights.values())
    loaded = vllm_engine.llm.model.loaded
    assert len(loaded) == 3 and out["ratchet_ms_median"] > 0 and out["vllm_ms_median"] > 0


def test_sensitivity_is_zero_for_a_batch_invariant_engine_and_seen_otherwise(model):
    engine = make_engine(model, backend="numpy", max_batch_size=8, max_seq_len=64)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, model.cfg.vocab_size, 4).tolist() for _ in range(6)]
    answers = [rng.integers(0, model.cfg.vocab_size, 5).tolist() for _ in range(6)]
    same = vs_vllm.sensitivity(engine, prompts, answers, targets=2, sizes=(6,))
    assert same["tokens"] == 10 and same["batch_6"] == {"changed_share": 0.0, "max_abs_change": 0.0}

    class BatchDependent:  # a row's value moves with the batch it is scored in
        def score(self, prompts, answers, temperature, batch_size):
            return [[-1.0 - 1e-3 * (len(prompts) > 1) * (j % 2) for j in range(len(a))] for a in answers]

    moved = vs_vllm.sensitivity(BatchDependent(), prompts, answers, targets=2, sizes=(6,))
    assert moved["batch_6"]["changed_share"] == pytest.approx(0.4)
    assert moved["batch_6"]["max_abs_change"] == pytest.approx(1e-3)


def test_headline_reads_the_sections_and_leaves_missing_ones_empty():
    res = {"eval": {"speedup_vs_vllm": 2.5, "ratchet": {"wall_s": 10.0}},
           "decode": {"b64": {"speedup_vs_vllm_seeded": 4.0, "ratchet": {"step_ms_median": 1.0}}},
           "update": {"error": "RuntimeError: x"}}
    h = vs_vllm.headline(res)
    assert h["eval_speedup_vs_vllm"] == 2.5 and h["decode_b64_speedup_vs_vllm"] == 4.0
    assert h["ratchet_decode_b64_ms"] == 1.0 and h["update_speedup_vs_vllm"] is None and h["vllm_eval_s"] is None


def test_eval_runs_both_engines_through_evaluate_on_the_same_problems(monkeypatch, tmp_path):
    from tiny_setup import tiny_setup

    setup = tiny_setup(tmp_path, num_test=12, with_eval=True)
    fake_vllm.install(monkeypatch, vocab=setup.model.cfg.vocab_size)  # tokens the tiny tokenizer has
    theirs = make_engine(setup.model, backend="vllm", max_batch_size=8, max_seq_len=32)
    inputs = (setup.task.tokenizer, setup.eval_problems, setup.prompt_fn)
    out = vs_vllm.bench_eval(setup.model, theirs, inputs, 8, 32, 4, backend="numpy")
    assert out["ratchet"]["n"] == out["vllm"]["n"] == 12
    assert out["ratchet"]["first_run_same_accuracy"] is True  # the warm run repeats the first
    assert 0 <= out["identical_answer_share"] <= 1 and out["speedup_vs_vllm"] > 0
    prompts = [a[1] for a in theirs.llm.llm_engine.added]
    assert prompts == [setup.prompt_fn(q) for q in setup.eval_problems["question"]]  # the same prompt tokens


def test_without_vllm_or_without_the_converted_model_one_clear_error(monkeypatch, tmp_path):
    import sys

    from ratchet.errors import InputError

    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ImportError, match="engine.backend 'vllm': vLLM cannot be imported"):
        vs_vllm.run("config/config.yaml", [f"results_dir={tmp_path}"])
    fake_vllm.install(monkeypatch)
    with pytest.raises(InputError, match="convert_weights"):
        vs_vllm.run("config/config.yaml", [f"results_dir={tmp_path}"])


def test_a_shape_run_decodes_both_engines_on_one_set_of_random_weights(monkeypatch):
    from ratchet.model.dtypes import round_to

    fake_vllm.FakeLLM.instances.clear()
    fake_vllm.install(monkeypatch)
    cfg = tiny_config(False, eos_token_ids=[])
    res = vs_vllm.run_shape("tiny", batches=(2, 3), prompt_len=4, new_tokens=5, cfg=cfg, backend="numpy")
    assert res["shape"] == "tiny" and res["params"] > 0 and res["engine_dtype"] == "fp16"
    assert set(res["headline"]) == {f"{k}_b{b}_ms" for k in ("ratchet_decode", "vllm_decode") for b in (2, 3)} | {
        f"decode_b{b}_speedup_vs_vllm" for b in (2, 3)}
    llm = fake_vllm.FakeLLM.instances[-1]
    assert llm.kwargs["max_num_seqs"] == 3 and llm.kwargs["gpu_memory_utilization"] == 0.3
    assert len(llm.llm_engine.added) == 2 * (2 + 3)  # each batch seeded and unseeded
    a, b = vs_vllm.shape_model(cfg, "bf16", seed=1), vs_vllm.shape_model(cfg, "bf16", seed=1)
    for name, w in a.weights.items():  # seeded, on the engine dtype's grid
        np.testing.assert_array_equal(w, b.weights[name])
        np.testing.assert_array_equal(round_to(w, "bf16"), w)
    norm = next(w for n, w in a.weights.items() if "norm" in n)
    assert abs(float(norm.mean()) - 1.0) < 0.05


def test_the_shape_option_refuses_an_unknown_shape_by_name(monkeypatch, capsys):
    import sys

    monkeypatch.setattr(sys, "argv", ["vs_vllm", "--shape", "qwen9"])
    with pytest.raises(SystemExit):
        vs_vllm.main()
    assert "--shape 'qwen9'" in capsys.readouterr().err


@pytest.mark.gpu
def test_shape_weights_drawn_on_the_gpu_are_seeded_and_on_the_grid():
    from ratchet.model.dtypes import round_to

    cfg = tiny_config(False, eos_token_ids=[])
    a, b = (vs_vllm.shape_model(cfg, "fp16", seed=1, device="cuda") for _ in range(2))
    c = vs_vllm.shape_model(cfg, "fp16", seed=2, device="cuda")
    for name, w in a.weights.items():
        assert w.dtype == np.float32 and w.shape == b.weights[name].shape
        np.testing.assert_array_equal(w, b.weights[name])
        np.testing.assert_array_equal(round_to(w, "fp16"), w)
    assert any((w != c.weights[n]).any() for n, w in a.weights.items())
