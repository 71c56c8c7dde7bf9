"""Checks at the start of a pipeline or a hand-run stage, before any work: a profile made for a
GPU must not quietly run for hours (and be killed for memory) on the NumPy engine."""

from __future__ import annotations

from pathlib import Path

from ratchet.device import check_vllm
from ratchet.errors import InputError

# Above this many parameters the NumPy engine is a reference, not a way to run a study: the
# real 0.5B model generates at about a token per second there and train_split needs ~10 GB.
CPU_MAX_PARAMS = 50_000_000


def estimated_parameters(model_cfg: dict) -> int | None:
    """The model's parameter count as far as it is known before download (None: unknown)."""
    source, path = model_cfg["source"], model_cfg.get("path")
    if source == "tiny":
        t = model_cfg["tiny"]  # without the embedding of the task's few dozen characters
        per_layer = 4 * t["hidden_size"] ** 2 + 3 * t["hidden_size"] * t["intermediate_size"]
        return t["num_layers"] * per_layer
    if source == "hub" or not path or not Path(path).exists():
        return None
    if source == "gguf":
        from ratchet.model.gguf_file import read_gguf

        return sum(t.n_elements for t in read_gguf(path).tensors)
    return _safetensors_parameters(Path(path))


def _safetensors_parameters(model_dir: Path) -> int | None:
    from ratchet.model.safetensors_io import read_header

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for f in files:
        header, _ = read_header(f)
        for name, info in header.items():
            if name != "__metadata__":
                n = 1
                for d in info["shape"]:
                    n *= d
                total += n
    return total


def check_device(cfg: dict, backend: str) -> None:
    """Refuse a large model on the NumPy engine unless the profile asks for NumPy by name, and
    vLLM where it cannot be imported or has no GPU."""
    if backend == "vllm":
        check_vllm()
    if backend != "numpy" or cfg["engine"]["backend"] == "numpy":
        return
    n = estimated_parameters(cfg["model"])
    if n is not None and n <= CPU_MAX_PARAMS:
        return
    m = cfg["model"]
    if n is not None:
        size = f"a model of {n / 1e6:.0f}M parameters"
    elif m["source"] == "hub":
        size = f"the hub model {m['repo_id']}"
    else:
        size = f"the model at {m['path']} (not found, so of unknown size)"
    raise InputError(f"config: {cfg['run_name']} has {size} and no CUDA GPU is usable here, so "
                     "engine.backend 'auto' would run it on the NumPy reference engine for hours; "
                     "run it on a GPU machine, or insist with engine.backend=numpy")
