"""export_colocated / export_split: a training's final weights in the Hugging Face format
(results/<run>/export/<mode>/), for transformers, vLLM or the hub: the source's tensor names,
the source's dtype (the engine's for a GGUF source), the tokenizer and a generation config."""

from __future__ import annotations

import json
from pathlib import Path

from ratchet.atomic import write_json
from ratchet.paths import RunPaths


def source_dtype(record: dict, engine_dtype: str) -> str:
    """The dtype the source model was released in; a GGUF file has none of ours: the engine's."""
    if record["kind"] != "hf":
        return engine_dtype
    from ratchet.model.export_hf import HF_DTYPES

    hf = json.loads((Path(record["path"]) / "config.json").read_text())
    ours = {name: dtype for dtype, name in HF_DTYPES.items()}
    return ours.get(hf.get("torch_dtype") or hf.get("dtype"), engine_dtype)


def _export(cfg: dict, run, mode: str) -> None:
    from ratchet.model.export_hf import export_hf
    from ratchet.model.io import load_engine_model

    paths = RunPaths.from_config(cfg)
    model = load_engine_model(paths.train_model(mode))
    dtype = source_dtype(json.loads(paths.source_done.read_text()), model.dtype)
    record = export_hf(model, paths.export_dir(mode), dtype, tokenizer_dir=paths.train_model(mode),
                       card=model_card(cfg, mode, model.dtype, dtype))
    # what `lossless` is measured against: the engine-dtype weights the evals ran, not the fp32 masters
    record.update(mode=mode, weights_from=str(paths.train_model(mode)), weights_from_dtype=model.dtype)
    write_json(paths.export_record(mode), record)
    print(f"[export_{mode}] {record['num_tensors']} tensors in {dtype} "
          f"({'lossless' if record['lossless'] else 'rounded from ' + model.dtype}) -> {paths.export_dir(mode)}")
    run.set_tags({"export.dtype": dtype, "export.lossless": str(record["lossless"])})
    run.log_output(paths.export_record(mode))
    run.log_output(paths.export_dir(mode) / "model.safetensors")


def model_card(cfg: dict, mode: str, evaluated: str, dtype: str) -> str:
    """The export's README.md: what it is and which weights (the source's card describes the
    base model, and is left out)."""
    m = cfg["model"]
    base = m.get("repo_id") if m["source"] == "hub" else m.get("path") or m["source"]
    rounded = "the same values" if dtype in (evaluated, "fp32") else f"rounded to {dtype}"
    return (f"# {cfg['run_name']}: GRPO, {mode} mode\n\n"
            f"Trained from `{base}` by ratchet (`ratchet export_{mode}`). The weights are the {evaluated} "
            f"copy the engine sampled and was evaluated with ({rounded}), not the fp32 masters.\n")


def export_colocated(cfg: dict, run) -> None:
    _export(cfg, run, "colocated")


def export_split(cfg: dict, run) -> None:
    _export(cfg, run, "split")
