"""The vLLM adapter's contract on a CPU without vLLM: one clear error where it cannot run,
the config key validated and refused by preflight, weight updates under Hugging Face names
that fuse back bit for bit, and, against a small fake vLLM (tests/fake_vllm.py), the
bookkeeping of add / step / cancel / resume, weight updates, checksums and scoring."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import fake_vllm
from fake_vllm import fake_prompt_logprob, fake_token
from ratchet import device, preflight
from ratchet.config import validate
from ratchet.engine.engine import Engine
from ratchet.engine.request import Request
from ratchet.engines import make_engine
from ratchet.errors import InputError
from ratchet.model import safetensors_io
from ratchet.model.convert_hf import WEIGHT_MAP, fuse, rename
from ratchet.model.export_hf import hf_tensors
from ratchet.model.layout import expected_shapes
from ratchet.vllm.engine import LOGPROBS_MODE, derived_seed
from ratchet.vllm.names import PADDED_VOCAB, hf_update, vllm_parameter
from random_model import FakeModel, random_weights
from test_engine import tiny_config

ROOT = Path(__file__).resolve().parents[1]
EOS = 7


def tiny(tied=False, dtype="fp16", **overrides):
    cfg = tiny_config(tied, eos_token_ids=[EOS], **overrides)
    return FakeModel(cfg, random_weights(cfg, seed=3, dtype=dtype), dtype)


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # as the adapter sets it; undone after
    fake_vllm.FakeLLM.instances.clear()
    return fake_vllm.install(monkeypatch)


def engine_on_fake(fake, model=None, **kwargs):
    model = model or tiny()
    return make_engine(model, backend="vllm", max_batch_size=8, max_seq_len=64, **kwargs)


# ------------------------------------------------------------------ without vLLM


def test_ratchet_and_the_adapter_import_without_vllm():
    code = ("import sys; sys.modules['vllm'] = None\n"
            "import ratchet.engines, ratchet.vllm.engine, ratchet.stages.eval_baseline, ratchet.rl.job\n"
            "assert 'vllm' not in {k for k, v in sys.modules.items() if v is not None}\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT,
                   env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)


def test_make_engine_without_vllm_is_one_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # any import of it raises
    with pytest.raises(ImportError, match=r"engine.backend 'vllm'.*cannot be imported.*pip install 'ratchet\[vllm\]'"):
        make_engine(tiny(), backend="vllm")


def test_the_config_takes_vllm_and_its_section():
    cfg = validate({"engine": {"backend": "vllm", "vllm": {"gpu_memory_utilization": 0.5}}})
    assert cfg["engine"]["backend"] == "vllm"
    assert cfg["engine"]["vllm"] == {"gpu_memory_utilization": 0.5, "enforce_eager": False}
    with pytest.raises(ValueError, match=r"engine.vllm.gpu_memory_utilization"):
        validate({"engine": {"vllm": {"gpu_memory_utilization": 1.5}}})
    with pytest.raises(ValueError, match=r"engine.vllm"):
        validate({"engine": {"vllm": {"tensor_parallel": 2}}})


def test_preflight_refuses_vllm_without_vllm_or_without_a_gpu(monkeypatch):
    cfg = validate({"engine": {"backend": "vllm"}})
    monkeypatch.setattr(device, "_vllm_import_error", lambda: "No module named 'vllm'")
    for check in (lambda: preflight.check_device(cfg, "vllm"), lambda: device.resolve_backend("vllm")):
        with pytest.raises(InputError, match=r"engine.backend is 'vllm'.*No module named 'vllm'.*"
                                             r"pip install 'ratchet\[vllm\]'.*dev/gpu/vllm.sh"):
            check()
    monkeypatch.setattr(device, "_vllm_import_error", lambda: None)
    monkeypatch.setattr(device, "_torch_cuda_available", lambda: False)
    with pytest.raises(InputError, match=r"engine.backend is 'vllm' but no CUDA GPU"):
        preflight.check_device(cfg, "vllm")
    monkeypatch.setattr(device, "_torch_cuda_available", lambda: True)
    preflight.check_device(cfg, "vllm")  # both there: nothing to refuse
    assert device.resolve_backend("vllm") == "vllm"
    assert device.resolve_backend("auto") in ("numpy", "cuda")  # never vllm unless asked by name


def test_this_machine_really_refuses_vllm():
    """No monkeypatching: the real import check on a machine without vLLM."""
    if device.vllm_problem() is None:
        pytest.skip("vLLM and a GPU are usable here")
    with pytest.raises(InputError, match="engine.backend is 'vllm'"):
        preflight.check_device(validate({"engine": {"backend": "vllm"}}), "vllm")


# ------------------------------------------------------------------ names


@pytest.mark.parametrize("tied,bias", [(False, True), (True, False)])
def test_update_names_split_and_fuse_back_bit_for_bit(tied, bias):
    model = tiny(tied, dtype="fp32", qkv_bias=bias)
    cfg, weights = model.cfg, model.weights
    named = dict(hf_update(cfg, weights))
    assert named.keys() == hf_tensors(cfg, weights).keys()
    assert "model.layers.1.self_attn.k_proj.weight" in named and "model.layers.0.mlp.up_proj.weight" in named
    assert ("lm_head.weight" in named) == (not tied)
    q = cfg.num_heads * cfg.head_dim
    assert named["model.layers.0.self_attn.q_proj.weight"].shape == (q, cfg.hidden_size)
    back = fuse(rename(named, WEIGHT_MAP, cfg, "round trip"), cfg, "round trip")
    assert back.keys() == weights.keys()
    for name, w in weights.items():
        assert np.array_equal(back[name].view(np.uint32), w.view(np.uint32)), name
    # a subset, on torch tensors too: views of the rows, nothing copied
    sub = {"layers.1.w_gate_up.weight": torch.from_numpy(weights["layers.1.w_gate_up.weight"])}
    parts = dict(hf_update(cfg, sub))
    assert list(parts) == ["model.layers.1.mlp.gate_proj.weight", "model.layers.1.mlp.up_proj.weight"]
    assert parts["model.layers.1.mlp.up_proj.weight"].data_ptr() == (
        sub["layers.1.w_gate_up.weight"][cfg.intermediate_size:].data_ptr())


def test_an_update_with_a_wrong_name_or_shape_is_refused_before_anything():
    cfg = tiny().cfg
    with pytest.raises(InputError, match="unexpected tensor 'layers.0.wq.weight'"):
        hf_update(cfg, {"layers.0.wq.weight": np.zeros((4, 4), np.float32)})
    with pytest.raises(InputError, match="'norm.weight' has shape"):
        hf_update(cfg, {"norm.weight": np.zeros(3, np.float32)})


def test_every_engine_tensor_has_its_vllm_parameter():
    for tied, bias in ((False, True), (True, False)):
        names = [vllm_parameter(n) for n in expected_shapes(tiny_config(tied, qkv_bias=bias))]
        assert len(set(names)) == len(names)
    assert vllm_parameter("layers.3.wqkv.weight") == "model.layers.3.self_attn.qkv_proj.weight"
    assert vllm_parameter("layers.12.w_gate_up.weight") == "model.layers.12.mlp.gate_up_proj.weight"


# ------------------------------------------------------------------ against the fake


def test_the_model_vllm_loads_is_a_hugging_face_directory_in_the_engine_dtype(fake):
    model = tiny(dtype="bf16")
    engine = engine_on_fake(fake, model, vllm_options={"gpu_memory_utilization": 0.25})
    llm = fake_vllm.FakeLLM.instances[-1]
    assert engine.llm is llm
    kw = llm.kwargs
    assert kw["dtype"] == "bfloat16" and kw["logprobs_mode"] == LOGPROBS_MODE == "processed_logprobs"
    # one position past max_seq_len: score asks for a token after a full-length sequence
    assert kw["skip_tokenizer_init"] and kw["max_model_len"] == 65 and kw["max_num_seqs"] == 8
    assert kw["gpu_memory_utilization"] == 0.25 and kw["enforce_eager"] is False
    path = Path(llm.model_path)
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["vocab_size"] == 64
    header, _ = safetensors_io.read_header(path / "model.safetensors")
    want = {k: v.shape for k, v in hf_tensors(model.cfg, model.weights).items()}
    assert {k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"} == want
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"BF16"}
    tmp = path.parent
    del engine, llm
    fake_vllm.FakeLLM.instances.clear()
    import gc

    gc.collect()
    assert not tmp.exists()  # the temporary directory goes with the engine


def expected_run(request: Request, eos: int, vocab: int, max_seq_len: int):
    """What the fake yields for `request` from where it stands, by ratchet's stop rule."""
    tokens, logprobs = list(request.output), list(request.logprobs)
    seed = None if request.greedy else derived_seed(request.seed, request.request_id, len(tokens))
    budget = min(request.max_new_tokens - len(tokens), max_seq_len - len(request.prompt) - len(tokens))
    fed = request.prompt + tokens
    for _ in range(budget):
        t, lp = fake_token(seed, fed, vocab)
        tokens.append(t)
        logprobs.append(lp)
        fed = fed + [t]
        if t == eos:
            return tokens, logprobs, "eos"
    return tokens, logprobs, "length"


def test_add_step_cancel_resume_fill_the_requests(fake):
    engine = engine_on_fake(fake)
    llm = engine.llm.llm_engine
    reqs = [Request(0, [1, 2, 3], max_new_tokens=30, temperature=0.8, seed=5),
            Request(1, [4, 5], max_new_tokens=3, temperature=1.3, seed=5),
            Request(2, [9] * 60, max_new_tokens=30, greedy=True, temperature=1.0),  # max_seq_len binds
            Request(3, [6], max_new_tokens=0)]
    want = {r.request_id: expected_run(r, EOS, 64, 64) for r in reqs}
    for r in reqs:
        engine.add(r)
    assert engine.num_unfinished == 4
    assert [p.max_tokens for _, _, p in llm.added] == [30, 3, 4]  # request 3 has no budget: never sent
    params = llm.added[0][2]
    assert params.logprobs == 0 and params.ignore_eos and params.stop_token_ids == [EOS]
    assert params.seed == derived_seed(5, 0, 0) and params.output_kind == fake_vllm.RequestOutputKind.DELTA
    assert llm.added[2][2].temperature == 0.0 and llm.added[2][2].seed is None  # greedy
    first = engine.step()
    assert [r.request_id for r in first] == [3] and reqs[3].finish_reason == "length"
    engine.step()
    with pytest.raises(RuntimeError, match="update_weights: 3 requests"):
        engine.update_weights({})
    cancelled = engine.cancel_all()
    assert llm.live == {} and sorted(llm.aborted) == sorted(rid for rid, _, _ in llm.added)
    assert engine.num_unfinished == 0
    for r in cancelled:
        assert r.finish_reason is None and len(r.output) == len(r.logprobs) == 2
        assert r.output == want[r.request_id][0][:2] and r.logprobs == want[r.request_id][1][:2]
    # resumed: prompt + output so far, the budget left, a seed of its own for the rest
    for r in cancelled:
        engine.add(r)
    resumed = {rid.split("-")[0]: (ids, p) for rid, ids, p in llm.added[3:]}
    assert resumed["0"][0] == reqs[0].prompt + reqs[0].output and resumed["0"][1].max_tokens == 28
    assert resumed["0"][1].seed == derived_seed(5, 0, 2) != derived_seed(5, 0, 0)
    assert resumed["2"][1].max_tokens == 2
    finished = []
    while engine.num_unfinished:
        finished += engine.step()
    assert sorted(r.request_id for r in finished) == sorted(r.request_id for r in cancelled)
    for r in reqs[:3]:
        tokens, logprobs, reason = expected_run(Request(r.request_id, r.prompt, r.max_new_tokens, r.temperature,
                                                        r.greedy, r.seed, r.output[:2], r.logprobs[:2]),
                                                EOS, 64, 64)
        assert (r.output, r.logprobs, r.finish_reason) == (tokens, logprobs, reason)
        assert len(r.output) <= r.max_new_tokens and r.num_tokens <= 64
    assert reqs[2].num_tokens == 64 if reqs[2].finish_reason == "length" else reqs[2].output[-1] == EOS
    assert engine.stats.num_generated_tokens == sum(len(r.output) for r in reqs)


def test_generate_shows_progress_as_ratchets_engine_does(fake, console_last_line):
    """`progress=True` (the eval stage's default) draws the same bar on vLLM: requests done and
    tokens a second on the console, no longer nothing for a whole eval."""
    engine = engine_on_fake(fake)
    reqs = engine.generate([Request(i, [1 + i, 2], max_new_tokens=6, seed=i) for i in range(3)], progress=True)
    assert all(r.finish_reason in ("eos", "length") for r in reqs)
    last = console_last_line()
    assert "generate" in last and "3/3" in last and "tok_s=" in last, last


def test_generate_runs_to_the_end_and_reruns_repeat(fake):
    def run():
        engine = engine_on_fake(fake)
        return engine.generate([Request(i, [1 + i, 2], max_new_tokens=12, temperature=0.9, seed=11) for i in range(5)])

    a, b = run(), run()
    assert all(r.finish_reason in ("eos", "length") for r in a)
    assert [(r.output, r.logprobs) for r in a] == [(r.output, r.logprobs) for r in b]
    for r in a:
        assert (r.output, r.logprobs, r.finish_reason) == expected_run(
            Request(r.request_id, r.prompt, 12, 0.9, seed=11), EOS, 64, 64)


def test_requests_it_cannot_honour_are_refused(fake):
    engine = engine_on_fake(fake)
    with pytest.raises(ValueError, match="greedy at temperature 0.5"):
        engine.add(Request(0, [1], 4, temperature=0.5, greedy=True))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.add(Request(0, [64], 4))
    engine.add(Request(0, [1], 4))
    with pytest.raises(ValueError, match="already running"):
        engine.add(Request(0, [1], 4))
    with pytest.raises(ValueError, match=r"temperature 0.005 on engine.backend 'vllm', which samples below 0.01"):
        engine.add(Request(1, [1], 4, temperature=0.005))  # vLLM would sample (and score) at 0.01
    with pytest.raises(InputError, match="no batch-invariant mode"):  # one line from the CLI
        engine_on_fake(fake, batch_invariant=True)
    with pytest.raises(ValueError, match="takes none of"):
        engine_on_fake(fake, overlap=False)


def test_update_weights_calls_load_weights_with_hf_names_and_shapes(fake):
    model = tiny()
    engine = engine_on_fake(fake, model)
    new = random_weights(model.cfg, seed=9, dtype="fp32")
    update = {"layers.0.wqkv.weight": new["layers.0.wqkv.weight"], "lm_head.weight": new["lm_head.weight"],
              "layers.1.w_gate_up.weight": torch.from_numpy(new["layers.1.w_gate_up.weight"])}
    engine.update_weights(update)
    loaded = engine.llm.model.loaded
    assert len(loaded) == 1 and engine.llm.prefix_resets == 1
    got = dict(loaded[0])
    want = hf_tensors(model.cfg, {k: new[k] for k in update})
    assert list(got) == list(want)
    for name, tensor in got.items():
        assert isinstance(tensor, torch.Tensor) and tuple(tensor.shape) == want[name].shape, name
        assert np.array_equal(tensor.numpy(), want[name]), name


def test_weight_checksums_read_vllms_parameters_as_the_engine_would(fake):
    """The fake holds vLLM's layout: fused qkv_proj / gate_up_proj, vocabulary rows padded to
    64; the checksums must equal those of ratchet's NumPy engine on the same weights."""
    model = tiny(dtype="fp16", vocab_size=50)
    held = {}
    for name, w in model.weights.items():
        t = torch.from_numpy(w).to(torch.float16)
        if name in PADDED_VOCAB:
            t = torch.cat([t, torch.full((64 - t.shape[0], t.shape[1]), 3.0, dtype=torch.float16)])
        held[vllm_parameter(name)] = torch.nn.Parameter(t, requires_grad=False)
    engine = make_engine(model, backend="vllm", max_seq_len=32, vllm_options=None)
    engine.llm = fake_vllm.FakeLLM(vocab=50, parameters=held)
    reference = Engine(model, backend="numpy", max_batch_size=2, max_seq_len=32).weight_checksums()
    assert engine.weight_checksums() == reference
    held.pop("model.norm.weight")
    with pytest.raises(NotImplementedError, match="model.norm.weight"):
        engine.weight_checksums()


def test_score_reads_the_answers_prompt_logprobs(fake):
    engine = engine_on_fake(fake)
    prompts, answers = [[1, 2, 3], [4], [5, 6]], [[8, 9], [], [10, 11, 12]]
    got = engine.score(prompts, answers, temperature=1.0)
    want = [[fake_prompt_logprob(p + a[:j], t) for j, t in enumerate(a)] for p, a in zip(prompts, answers)]
    assert got == want
    added = engine.llm.llm_engine.added
    assert [ids for _, ids, _ in added] == [[1, 2, 3, 8, 9], [5, 6, 10, 11, 12]]
    assert all(p.prompt_logprobs == 0 and p.max_tokens == 1 for _, _, p in added)
    with pytest.raises(NotImplementedError, match="before temperature"):
        engine.score(prompts, answers, temperature=0.7)
    with pytest.raises(ValueError, match="answer 0 has token id -1"):  # the checks ratchet's engine makes
        engine.score([[1]], [[-1]], temperature=1.0)
    assert len(engine.llm.llm_engine.added) == 2  # refused before anything reached vLLM


def test_score_refuses_a_sequence_with_no_position_left_and_aborts_what_it_queued_on_failure(fake):
    engine = engine_on_fake(fake, tiny(max_position_embeddings=64))  # no 65th position for score's token
    assert engine.max_model_len == 64
    with pytest.raises(ValueError, match="answer 1 fills the model's 64 positions"):
        engine.score([[1], [1] * 60], [[2], [3] * 4], temperature=1.0)
    assert engine.llm.llm_engine.added == []  # refused before vLLM (which raises its own error)
    step = engine.llm.llm_engine.step
    engine.llm.llm_engine.step = lambda: (_ for _ in ()).throw(RuntimeError("injected"))
    with pytest.raises(RuntimeError, match="injected"):
        engine.score([[1], [2]], [[3], [4]], temperature=1.0)
    assert engine.llm.llm_engine.live == {}  # left there, they would run under the next weights
    engine.llm.llm_engine.step = step


def test_vllm_runs_in_this_process_where_its_weights_are_written(fake, monkeypatch):
    """update_weights and weight_checksums hand vLLM a function (apply_model), which its
    engine process cannot receive: the adapter asks for the engine in-process, and refuses a
    user's explicit multiprocessing in one line."""
    from ratchet.vllm.engine import MULTIPROCESSING_ENV

    monkeypatch.setenv(MULTIPROCESSING_ENV, "placeholder")  # restored (absent) after the test
    monkeypatch.delenv(MULTIPROCESSING_ENV)
    engine_on_fake(fake)
    assert os.environ[MULTIPROCESSING_ENV] == "0"
    monkeypatch.setenv(MULTIPROCESSING_ENV, "1")
    with pytest.raises(InputError, match=f"needs vLLM's engine in this process \\({MULTIPROCESSING_ENV}=0\\)"):
        engine_on_fake(fake)


def test_a_generate_that_fails_midway_cancels_its_batch_in_vllm(fake):
    engine = engine_on_fake(fake)
    step = engine.llm.llm_engine.step
    engine.llm.llm_engine.step = lambda: (_ for _ in ()).throw(RuntimeError("injected"))
    batch = [Request(i, [1, 2], max_new_tokens=3, temperature=1.0, seed=i) for i in range(2)]
    with pytest.raises(RuntimeError, match="injected"):
        engine.generate(batch)
    assert engine.num_unfinished == 0
    engine.llm.llm_engine.step = step
    assert engine.generate([Request(5, [1, 2], max_new_tokens=3, seed=5)])[0].finish_reason == "length"


def test_vllm_compiled_under_the_trainers_deterministic_mode_is_refused_before_it_starts(fake):
    import torch

    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with pytest.raises(ValueError, match="engine.vllm.enforce_eager=true"):
            engine_on_fake(fake)
        assert not fake_vllm.FakeLLM.instances  # refused before vLLM was started
        assert engine_on_fake(fake, vllm_options={"enforce_eager": True}).llm.kwargs["enforce_eager"] is True
    finally:
        torch.use_deterministic_algorithms(was)
