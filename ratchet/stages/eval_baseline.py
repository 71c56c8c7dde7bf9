"""eval_baseline: greedy accuracy of the converted model on the test split, before training."""

from __future__ import annotations

from ratchet.atomic import write_json, write_parquet
from ratchet.paths import RunPaths


def run_eval(cfg: dict, run, model_dir, name: str) -> dict:
    """Shared by the baseline and the after-training evals: writes <name>.json and answers."""
    from ratchet.device import resolve_backend
    from ratchet.engines import make_engine
    from ratchet.model.io import load_engine_model
    from ratchet.rl.evaluate import eval_inputs, evaluate

    paths = RunPaths.from_config(cfg)
    e, ev = cfg["engine"], cfg["eval"]
    model = load_engine_model(model_dir)
    tokenizer, problems, prompt_fn = eval_inputs(cfg)
    engine = make_engine(model, backend=resolve_backend(e["backend"]), max_batch_size=e["max_batch_size"],
                         max_seq_len=e["max_seq_len"], vllm_options=e["vllm"])
    summary, answers = evaluate(engine, tokenizer, problems, prompt_fn, ev["max_new_tokens"])
    summary.update({"name": name, "backend": engine.backend_name, "dtype": model.dtype})
    out_json, out_answers = paths.eval_json(name), paths.eval_answers(name)
    write_parquet(out_answers, answers)
    write_json(out_json, summary)
    print(f"[{name}] accuracy {summary['accuracy']:.4f} ± {summary['accuracy_stderr']:.4f} "
          f"on {summary['n']} problems, format {summary['format_rate']:.3f}, "
          f"{summary['tokens_per_s']:.0f} tok/s")
    run.log_metrics({f"eval/{k}": v for k, v in summary.items() if isinstance(v, (int, float))})
    run.log_output(out_json)
    run.log_output(out_answers)
    return summary


def eval_baseline(cfg: dict, run) -> None:
    run_eval(cfg, run, RunPaths.from_config(cfg).model, "baseline")
