"""convert_weights: source model -> engine layout in the engine dtype, with a manifest."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from ratchet.model.io import save_engine_model
from ratchet.model.layout import num_parameters
from ratchet.paths import RunPaths


def convert_weights(cfg: dict, run) -> None:
    paths = RunPaths.from_config(cfg)
    record = json.loads(paths.source_done.read_text())
    src = Path(record["path"])
    dtype = cfg["engine"]["dtype"]
    with tempfile.TemporaryDirectory(prefix="ratchet-tok-") as tok_tmp:
        if record["kind"] == "gguf":
            from ratchet.model.convert_gguf import convert_gguf

            model_cfg, weights = convert_gguf(src, Path(tok_tmp))
            tokenizer_dir = Path(tok_tmp)
        else:
            from ratchet.model.convert_hf import convert_hf

            model_cfg, weights = convert_hf(src)
            tokenizer_dir = src
        save_engine_model(paths.model, model_cfg, weights, dtype, tokenizer_dir=tokenizer_dir)
    manifest = json.loads(paths.manifest.read_text())
    n = num_parameters(model_cfg)
    print(f"[convert_weights] {n:,} parameters in {dtype} -> {paths.model}")
    run.log_metrics({"model/num_parameters": n, "model/num_layers": model_cfg.num_layers,
                     "model/vocab_size": model_cfg.vocab_size})
    run.set_tags({"model.file_sha256": manifest["file_sha256"], "model.dtype": dtype})
    run.log_output(paths.manifest)
    run.log_output(paths.model / "config.json")
