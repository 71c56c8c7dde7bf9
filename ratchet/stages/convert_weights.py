"""convert_weights: source model -> engine layout in the engine dtype, with a manifest;
`convert.snap_to` first rounds the source onto a grid (the released-bf16 condition)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from ratchet.model.io import save_engine_model
from ratchet.model.layout import num_parameters
from ratchet.model.snap import changed_by_storage, snap_weights
from ratchet.paths import RunPaths


def convert_weights(cfg: dict, run) -> None:
    paths = RunPaths.from_config(cfg)
    record = json.loads(paths.source_done.read_text())
    src = Path(record["path"])
    dtype = cfg["engine"]["dtype"]
    snap_to = cfg["convert"]["snap_to"]
    with tempfile.TemporaryDirectory(prefix="ratchet-tok-") as tok_tmp:
        if record["kind"] == "gguf":
            from ratchet.model.convert_gguf import convert_gguf

            model_cfg, weights = convert_gguf(src, Path(tok_tmp))
            tokenizer_dir = Path(tok_tmp)
        else:
            from ratchet.model.convert_hf import convert_hf

            model_cfg, weights = convert_hf(src)
            tokenizer_dir = src
        weights = snap_weights(weights, snap_to)
        snapped = {} if snap_to is None else {  # the default's manifest stays as it was
            "snap_to": snap_to, "snap_changed_by_storage": _storage_changes(weights, snap_to, dtype)}
        save_engine_model(paths.model, model_cfg, weights, dtype, tokenizer_dir=tokenizer_dir,
                          manifest_extra=snapped)
    manifest = json.loads(paths.manifest.read_text())
    n = num_parameters(model_cfg)
    print(f"[convert_weights] {n:,} parameters in {dtype} -> {paths.model}")
    run.log_metrics({"model/num_parameters": n, "model/num_layers": model_cfg.num_layers,
                     "model/vocab_size": model_cfg.vocab_size}
                    | ({"model/snap_changed_by_storage": snapped["snap_changed_by_storage"]} if snapped else {}))
    run.set_tags({"model.file_sha256": manifest["file_sha256"], "model.dtype": dtype,
                  "model.snap_to": snap_to or "none"})
    run.log_output(paths.manifest)
    run.log_output(paths.model / "config.json")


def _storage_changes(weights, snap_to: str, dtype: str) -> int:
    """Count (and say) the snapped values that storing in the engine dtype changes. They are
    kept in the engine dtype all the same: it is the dtype every engine of the run reads, and
    the trainer's masters start from what is stored. The bf16 values fp16 cannot hold lie below
    its normal range and round onto a coarser step, so they stay on the bf16 grid; fp16 values
    stored in bf16 mostly leave the fp16 grid (the warning says how many)."""
    changed = changed_by_storage(weights, dtype)
    total = sum(w.size for w in weights.values())
    print(f"[convert_weights] source snapped to the {snap_to} grid; storing it in {dtype} changes "
          f"{changed:,} of {total:,} values")
    if changed:
        print(f"[convert_weights] WARNING: {changed:,} {snap_to}-grid values ({changed / total:.2e} of "
              f"the weights) change when stored in {dtype}; the run starts from the stored values")
    return changed
