"""ratchet's engine beside vLLM in one process, on the same converted model (the same fp16
values: vLLM loads the Hugging Face export of the engine's own weights) and the same prompt
tokens: decode steps at B = 64 and 512 (vLLM with per-request seeds and without), the GSM8K
greedy eval through the product's `evaluate` on both engines (wall, tokens/s, accuracy, share
of identical answers), the weight update, and batch sensitivity (the same tokens scored alone
and in batches of 64 and 512).

    python -m ratchet.bench.vs_vllm --config config/local.yaml --out vllm.json
    python -m ratchet.bench.vs_vllm --shape qwen2.5-7b --batches 64,256 --out vllm-7b.json

With --shape (a shape of ratchet.bench's: Coder-1.5B's, 7B's), decode only, on seeded random
weights at that shape: no model files, and both engines hold the same values (vLLM loads
their Hugging Face export, as it loads a real model's).

vLLM runs in-process (set VLLM_ENABLE_V1_MULTIPROCESSING=0, see dev/gpu/vllm.sh); one vLLM
instance serves every section (its start-up, compilation and graph capture, is timed apart)."""

from __future__ import annotations

import argparse
import json
import os
import time
import traceback
from pathlib import Path

import numpy as np

SECTIONS = ("decode", "eval", "update", "sensitivity")
SPECIAL_FROM = 151643  # Qwen2's special tokens start here: random prompts stay below


def _sync():
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def ratchet_decode(engine, prompts: list[list[int]], new_tokens: int, seed: int) -> dict:
    """Wall time of each `Engine.step` (overlapped, as the product runs it) at temperature 1."""
    from ratchet.bench.engine_steps import timed_steps
    from ratchet.engine.request import Request

    reqs = [Request(i, p, max_new_tokens=new_tokens, temperature=1.0, seed=seed) for i, p in enumerate(prompts)]
    first, steps, wall = timed_steps(engine, reqs)
    assert all(len(r.output) == new_tokens for r in reqs), "ratchet decode: an answer stopped early"
    return {"step_ms_median": 1e3 * float(np.median(steps[1:])), "first_step_s": first,
            "decode_tokens_per_s": len(prompts) * (new_tokens - 1) / wall}


def vllm_decode(llm, prompts: list[list[int]], new_tokens: int, seeded: bool, seed: int) -> dict:
    """Wall time of each `llm_engine.step()` on the same prompts, at temperature 1 with each
    sampled token's log-probability (what RL asks of it), per-request seeds or none."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    engine = llm.llm_engine
    for i, p in enumerate(prompts):
        params = SamplingParams(temperature=1.0, max_tokens=new_tokens, min_tokens=new_tokens, ignore_eos=True,
                                logprobs=0, detokenize=False, output_kind=RequestOutputKind.DELTA,
                                seed=(seed * 100003 + i) if seeded else None)
        engine.add_request(f"decode-{seeded}-{i}", {"prompt_token_ids": p}, params)
    steps, produced, first = [], 0, None
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        t = time.perf_counter()
        outs = engine.step()
        dt = time.perf_counter() - t
        produced += sum(len(o.outputs[0].token_ids) for o in outs)
        if first is None:
            first = dt
        else:
            steps.append(dt)
    wall = time.perf_counter() - start
    assert produced == len(prompts) * new_tokens, f"vllm decode: {produced} tokens"
    # the first steps prefill (chunked, with the first decodes); the median is the decode step
    return {"step_ms_median": 1e3 * float(np.median(steps)), "first_step_s": first,
            "steps": len(steps) + 1, "decode_tokens_per_s": len(prompts) * new_tokens / wall}


def bench_decode(model, llm, batches=(64, 512), prompt_len=128, new_tokens=256, seed=0,
                 backend: str = "cuda") -> dict:
    from ratchet.engines import make_engine

    out = {"prompt_len": prompt_len, "new_tokens": new_tokens}
    vocab = min(model.cfg.vocab_size, SPECIAL_FROM)
    for batch in batches:
        rng = np.random.default_rng(seed + batch)
        prompts = [rng.integers(0, vocab, prompt_len).tolist() for _ in range(batch)]
        engine = make_engine(model, backend=backend, max_batch_size=batch, max_seq_len=prompt_len + new_tokens,
                             eos_ids=[])
        row = {"ratchet": ratchet_decode(engine, prompts, new_tokens, seed)}
        del engine
        row["vllm_seeded"] = vllm_decode(llm, prompts, new_tokens, True, seed)
        row["vllm_unseeded"] = vllm_decode(llm, prompts, new_tokens, False, seed)
        for kind in ("vllm_seeded", "vllm_unseeded"):
            row[f"speedup_vs_{kind}"] = row[kind]["step_ms_median"] / row["ratchet"]["step_ms_median"]
        out[f"b{batch}"] = row
        print(f"[vs_vllm] decode B={batch}: ratchet {row['ratchet']['step_ms_median']:.3f} ms, vLLM seeded "
              f"{row['vllm_seeded']['step_ms_median']:.3f} ms, unseeded {row['vllm_unseeded']['step_ms_median']:.3f} ms",
              flush=True)
    return out


def bench_eval(model, vllm_engine, inputs, max_batch_size: int, max_seq_len: int, max_new_tokens: int,
               backend: str = "cuda") -> dict:
    """The whole test split, greedy, through `evaluate` on each engine. ratchet's runs twice and
    the second counts: the first captures its CUDA graphs, which vLLM did at its start-up
    (timed apart, like ratchet's first run)."""
    from ratchet.engines import make_engine
    from ratchet.rl.evaluate import evaluate

    tokenizer, problems, prompt_fn = inputs
    engine = make_engine(model, backend=backend, max_batch_size=max_batch_size, max_seq_len=max_seq_len)
    first, _ = evaluate(engine, tokenizer, problems, prompt_fn, max_new_tokens, progress=False)
    ours, our_answers = evaluate(engine, tokenizer, problems, prompt_fn, max_new_tokens, progress=False)
    del engine
    theirs, their_answers = evaluate(vllm_engine, tokenizer, problems, prompt_fn, max_new_tokens, progress=False)
    same = float(np.mean(our_answers["response"].to_numpy() == their_answers["response"].to_numpy()))
    verdict = float(np.mean(our_answers["reward"].to_numpy() == their_answers["reward"].to_numpy()))
    keys = ("n", "accuracy", "accuracy_stderr", "wall_s", "tokens_per_s", "total_tokens", "mean_tokens")
    out = {"max_new_tokens": max_new_tokens,
           "ratchet": {**{k: ours[k] for k in keys}, "first_run_wall_s": first["wall_s"],
                       "first_run_same_accuracy": first["accuracy"] == ours["accuracy"]},
           "vllm": {k: theirs[k] for k in keys}, "identical_answer_share": same,
           "same_verdict_share": verdict, "speedup_vs_vllm": theirs["wall_s"] / ours["wall_s"]}
    print(f"[vs_vllm] eval: ratchet {ours['wall_s']:.1f} s acc {ours['accuracy']:.4f}, vLLM {theirs['wall_s']:.1f} s "
          f"acc {theirs['accuracy']:.4f}, identical answers {same:.3f}", flush=True)
    return out


def bench_update(model, vllm_engine, repeats: int = 5, backend: str = "cuda") -> dict:
    """`update_weights` with every tensor as fp32 where the engine takes it without a host
    copy (the trainer's masters on the GPU), both engines."""
    import torch

    from ratchet.engines import make_engine

    engine = make_engine(model, backend=backend, max_batch_size=8, max_seq_len=64)
    device = engine.weight_device
    masters = {k: torch.as_tensor(np.asarray(v, dtype=np.float32), device=device) for k, v in model.weights.items()}
    if device == "cpu":
        masters = {k: v.numpy() for k, v in masters.items()}
    out = {"params": int(sum(t.numel() if hasattr(t, "numel") else t.size for t in masters.values()))}
    for name, target in (("ratchet", engine), ("vllm", vllm_engine)):
        times = []
        for _ in range(repeats + 1):
            _sync()
            t = time.perf_counter()
            target.update_weights(masters)
            _sync()
            times.append(time.perf_counter() - t)
        out[f"{name}_ms_median"] = 1e3 * float(np.median(times[1:]))
    out["speedup_vs_vllm"] = out["vllm_ms_median"] / out["ratchet_ms_median"]
    print(f"[vs_vllm] update: ratchet {out['ratchet_ms_median']:.2f} ms, vLLM {out['vllm_ms_median']:.2f} ms", flush=True)
    return out


def sensitivity(engine, prompts, answers, targets: int = 8, sizes=(64, 512)) -> dict:
    """The first `targets` answers scored alone, then among the first `size` answers: the share
    of their tokens whose log-probability changed (any bit) and the largest change."""
    alone = [engine.score([prompts[i]], [answers[i]], 1.0, 1)[0] for i in range(targets)]
    out = {"tokens": int(sum(len(a) for a in alone))}
    for size in sizes:
        size = min(size, len(prompts))
        got = engine.score(prompts[:size], answers[:size], 1.0, size)[:targets]
        d = np.abs(np.concatenate([np.subtract(g, a) for g, a in zip(got, alone)]))
        out[f"batch_{size}"] = {"changed_share": float(np.mean(d > 0)), "max_abs_change": float(d.max())}
    return out


def bench_sensitivity(model, vllm_engine, inputs, max_seq_len: int, n: int = 512, answer_len: int = 128,
                      backend: str = "cuda") -> dict:
    """Real prompts and answers (ratchet's greedy ones, cut to `answer_len` tokens)."""
    from ratchet.engine.request import Request
    from ratchet.engines import make_engine

    _, problems, prompt_fn = inputs
    prompts = [prompt_fn(q) for q in problems["question"].head(n)]
    engine = make_engine(model, backend=backend, max_batch_size=n, max_seq_len=max_seq_len)
    answers = [r.output for r in engine.generate([Request(i, p, answer_len, greedy=True) for i, p in enumerate(prompts)])]
    out = {"answers": len(answers), "ratchet_default": sensitivity(engine, prompts, answers)}
    del engine
    invariant = make_engine(model, backend=backend, max_batch_size=64, max_seq_len=max_seq_len, batch_invariant=True)
    out["ratchet_batch_invariant"] = sensitivity(invariant, prompts[:64], answers[:64], sizes=(64,))
    del invariant
    out["vllm"] = sensitivity(vllm_engine, prompts, answers)
    out["vllm_batch_invariant_env"] = os.environ.get("VLLM_BATCH_INVARIANT", "")
    print(f"[vs_vllm] sensitivity: {json.dumps(out)}", flush=True)
    return out


def shape_model(cfg, dtype: str = "fp16", seed: int = 0, device: str | None = None):
    """An EngineModel of seeded random weights at `cfg`'s shapes, on `dtype`'s grid: the
    bench's init (workload.init_of). Drawn on the GPU where there is one (7B's 7.6B values
    took NumPy over five minutes on the H200's host), else on the host (NumPy), so that a CPU
    test builds it too; the two draws differ, and both engines of a run hold the same one."""
    import torch

    from ratchet.bench.workload import init_of
    from ratchet.model.dtypes import round_to
    from ratchet.model.io import EngineModel
    from ratchet.model.layout import expected_shapes

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    weights = {}
    if device == "cuda":
        grid = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
        gen = torch.Generator(device="cuda").manual_seed(seed)
        for name, shape in expected_shapes(cfg).items():
            mean, std = init_of(name)
            w = torch.randn(shape, device="cuda", generator=gen) * std
            w = (w + mean if mean else w).to(grid).float()  # round to nearest even, as round_to
            weights[name] = w.cpu().numpy()
        return EngineModel(cfg, weights, dtype)
    rng = np.random.default_rng(seed)
    for name, shape in expected_shapes(cfg).items():
        mean, std = init_of(name)
        w = rng.standard_normal(shape, dtype=np.float32) * np.float32(std)
        weights[name] = round_to(w + np.float32(mean) if mean else w, dtype)
    return EngineModel(cfg, weights, dtype)


def run_shape(shape: str, batches=(64, 512), dtype: str = "fp16", prompt_len: int = 128,
              new_tokens: int = 256, cfg=None, backend: str = "cuda", vllm_share: float = 0.3) -> dict:
    """Decode at B in `batches` on both engines at one of the bench's shapes (`cfg` in its
    place: a test's tiny one). `vllm_share`: vLLM's gpu_memory_utilization (the engine
    beside it needs the weights once more and its own cache)."""
    from ratchet.bench.workload import SHAPES
    from ratchet.engines import make_engine
    from ratchet.vllm.engine import import_vllm

    vllm = import_vllm()  # one clear error where it is missing
    cfg = cfg or SHAPES[shape]()
    t = time.perf_counter()
    model = shape_model(cfg, dtype)
    res = {"vllm": vllm.__version__, "shape": shape, "engine_dtype": dtype, "weights_s": time.perf_counter() - t,
           "params": int(sum(w.size for w in model.weights.values()))}
    import torch

    res["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    t = time.perf_counter()
    vllm_engine = make_engine(model, backend="vllm", max_batch_size=max(batches),
                              max_seq_len=prompt_len + new_tokens, eos_ids=[],
                              vllm_options={"gpu_memory_utilization": vllm_share})
    res["vllm_start_s"] = time.perf_counter() - t
    res["decode"] = bench_decode(model, vllm_engine.llm, batches=batches, prompt_len=prompt_len,
                                 new_tokens=new_tokens, backend=backend)
    res["headline"] = {}
    for b in batches:
        row = res["decode"][f"b{b}"]
        res["headline"].update({f"ratchet_decode_b{b}_ms": row["ratchet"]["step_ms_median"],
                                f"vllm_decode_b{b}_ms": row["vllm_seeded"]["step_ms_median"],
                                f"decode_b{b}_speedup_vs_vllm": row["speedup_vs_vllm_seeded"]})
    return res


def run(config: str, overrides: list[str], sections=SECTIONS) -> dict:
    import torch

    from ratchet import config as config_mod
    from ratchet.engines import make_engine
    from ratchet.errors import InputError
    from ratchet.model.io import load_engine_model
    from ratchet.paths import RunPaths
    from ratchet.rl.evaluate import eval_inputs
    from ratchet.vllm.engine import import_vllm

    vllm = import_vllm()  # one clear error where it is missing
    cfg = config_mod.load(config, overrides)
    paths = RunPaths.from_config(cfg)
    missing = [p for p in (paths.manifest, paths.test_data) if not p.is_file()]
    if missing:
        raise InputError(f"vs_vllm: {missing[0]} is not there yet; make the converted model and the "
                         f"data first: snakemake --cores all convert_weights download_data "
                         f"--configfile {config}")
    e = cfg["engine"]
    model = load_engine_model(paths.model)
    res = {"device": torch.cuda.get_device_name(0), "vllm": vllm.__version__, "torch": torch.__version__,
           "engine_dtype": model.dtype, "model": str(cfg["model"].get("path") or cfg["model"].get("repo_id"))}
    t = time.perf_counter()
    vllm_engine = make_engine(model, backend="vllm", max_batch_size=max(512, e["max_batch_size"]),
                              max_seq_len=e["max_seq_len"], vllm_options=e["vllm"])
    res["vllm_start_s"] = time.perf_counter() - t
    inputs = eval_inputs(cfg)
    for name in sections:
        t = time.perf_counter()
        try:
            if name == "decode":
                res[name] = bench_decode(model, vllm_engine.llm)
            elif name == "eval":
                res[name] = bench_eval(model, vllm_engine, inputs, e["max_batch_size"], e["max_seq_len"],
                                       cfg["eval"]["max_new_tokens"])
            elif name == "update":
                res[name] = bench_update(model, vllm_engine)
            elif name == "sensitivity":
                res[name] = bench_sensitivity(model, vllm_engine, inputs, e["max_seq_len"])
        except Exception as err:  # one broken section must not hide the others
            res[name] = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
            print(f"[vs_vllm] {name} failed: {res[name]['traceback']}", flush=True)
        res[name]["section_s"] = time.perf_counter() - t
    res["headline"] = headline(res)
    return res


def headline(res: dict) -> dict:
    """The figures the vLLM issue tracks, flat."""
    def get(*keys):
        node = res
        for k in keys:
            node = node.get(k, {}) if isinstance(node, dict) else {}
        return float(node) if isinstance(node, (int, float)) else None

    return {"eval_speedup_vs_vllm": get("eval", "speedup_vs_vllm"),
            "decode_b64_speedup_vs_vllm": get("decode", "b64", "speedup_vs_vllm_seeded"),
            "decode_b64_speedup_vs_vllm_unseeded": get("decode", "b64", "speedup_vs_vllm_unseeded"),
            "decode_b512_speedup_vs_vllm": get("decode", "b512", "speedup_vs_vllm_seeded"),
            "ratchet_decode_b64_ms": get("decode", "b64", "ratchet", "step_ms_median"),
            "vllm_decode_b64_ms": get("decode", "b64", "vllm_seeded", "step_ms_median"),
            "ratchet_eval_s": get("eval", "ratchet", "wall_s"), "vllm_eval_s": get("eval", "vllm", "wall_s"),
            "ratchet_eval_accuracy": get("eval", "ratchet", "accuracy"),
            "vllm_eval_accuracy": get("eval", "vllm", "accuracy"),
            "identical_answer_share": get("eval", "identical_answer_share"),
            "update_speedup_vs_vllm": get("update", "speedup_vs_vllm")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="config/local.yaml")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--sections", default=",".join(SECTIONS))
    ap.add_argument("--shape", default=None, help="decode only, random weights at this shape "
                    "(qwen2.5-0.5b, qwen2.5-coder-1.5b, qwen2.5-7b); no config or model files")
    ap.add_argument("--batches", default="64,512", help="with --shape: the decode batch sizes")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.shape:
        from ratchet.bench.workload import SHAPES

        if args.shape not in SHAPES:
            ap.error(f"--shape {args.shape!r}: one of {', '.join(SHAPES)}")
        res = run_shape(args.shape, tuple(int(b) for b in args.batches.split(",")))
    else:
        res = run(args.config, args.overrides, args.sections.split(","))
    text = json.dumps(res, indent=2, default=float)
    if args.out:
        from ratchet.atomic import write_text

        write_text(Path(args.out), text + "\n")
    print(text)


if __name__ == "__main__":
    main()
