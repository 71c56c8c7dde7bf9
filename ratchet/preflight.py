"""Checks at the start of a pipeline or a hand-run stage, before any work: a profile made for a
GPU must not quietly run for hours (and be killed for memory) on the NumPy engine, a training
must not fill the disk with checkpoints halfway through. (A GPU smaller than the profile's rules
need: ratchet/gpu_oom.py.)"""

from __future__ import annotations

import shutil
from pathlib import Path

from ratchet.device import check_vllm
from ratchet.errors import InputError

# Above this many parameters the NumPy engine is a reference, not a way to run a study: the
# real 0.5B model generates at about a token per second there and train_split needs ~10 GB.
CPU_MAX_PARAMS = 50_000_000


def check_settings(cfg: dict) -> None:
    """The rules that span keys of a stage's settings (GRPO's, the ablations' and each of their
    runs'), checked when the config is loaded rather than when the stage runs: a bad pair of
    keys stops the pipeline before its first rule, as a bad key does. Raises ConfigError."""
    from ratchet.config import ConfigError
    from ratchet.mismatch.ablation import FIX_RUNS, AblateSettings
    from ratchet.mismatch.learning import LearningSettings

    ablate = AblateSettings.from_config(cfg)  # GRPOConfig.from_config(cfg) within
    LearningSettings.from_config(cfg)
    for run in FIX_RUNS:  # each ablation run's GRPO settings: ablate's keys over train's
        try:
            ablate.grpo(run)
        except ConfigError as e:  # a key of ablate's (a run's own few are fixed and valid)
            raise ConfigError(f"config ablate: {str(e).removeprefix('config train: ')}") from None


def estimated_parameters(model_cfg: dict) -> int | None:
    """The model's parameter count as far as it is known before download (None: unknown)."""
    source, path = model_cfg["source"], model_cfg.get("path")
    if source == "tiny":
        t = model_cfg["tiny"]  # without the embedding of the task's few dozen characters
        per_layer = 4 * t["hidden_size"] ** 2 + 3 * t["hidden_size"] * t["intermediate_size"]
        return t["num_layers"] * per_layer
    if source == "hub" or not path or not Path(path).expanduser().exists():
        return None
    path = Path(path).expanduser()  # as download_model reads it
    if source == "gguf":
        from ratchet.model.convert_gguf import open_gguf

        return sum(t.n_elements for t in open_gguf(path).tensors)
    return _safetensors_parameters(path) if path.is_dir() else None


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
        found = Path(m["path"]).expanduser().exists()
        size = f"the model at {m['path']} ({'no *.safetensors directory' if found else 'not found'}, so of unknown size)"
    raise InputError(f"config: {cfg['run_name']} has {size} and no CUDA GPU is usable here, so "
                     "engine.backend 'auto' would run it on the NumPy reference engine for hours; "
                     "run it on a GPU machine, or insist with engine.backend=numpy")


# A checkpoint holds the fp32 masters and AdamW's two fp32 moments (12 bytes a parameter); the
# split mode's also the engine's copy of the weights, in the engine dtype.
TRAINER_BYTES_PER_PARAM = 12
ENGINE_BYTES_PER_PARAM = {"fp32": 4, "fp16": 2, "bf16": 2}


def checkpoint_plan(cfg: dict, mode: str, n_params: int) -> tuple[int, int]:
    """(bytes of one checkpoint, how many exist at once at the peak) for one training:
    save_checkpoint writes the new one before it removes the oldest, so keep + 1, and no more
    than the training saves (every checkpoint_every steps, and after the last in colocated)."""
    t = cfg["train"]
    per = n_params * (TRAINER_BYTES_PER_PARAM + (ENGINE_BYTES_PER_PARAM[cfg["engine"]["dtype"]]
                                                 if mode == "split" else 0))
    saves = t["steps"] // t["checkpoint_every"] + (mode == "colocated" and t["steps"] % t["checkpoint_every"] > 0)
    return per, min(t["keep_checkpoints"] + 1, max(1, saves))


def check_checkpoint_disk(cfg: dict, mode: str, checkpoint_dir: str | Path, free_bytes: int | None = None) -> None:
    """Refuse to start a training whose checkpoints the disk under `checkpoint_dir` cannot hold
    (the ones already there count as held), naming the settings that change it. The model's
    size is read from its source before download; unknown (a hub model not yet fetched): no
    check. Each training checks alone: two side by side need the sum."""
    if cfg["train"]["keep_checkpoints"] == 0:
        return
    n = estimated_parameters(cfg["model"])
    if not n:
        return
    per, held = checkpoint_plan(cfg, mode, n)
    from ratchet.rl.checkpoint import list_checkpoints

    root = Path(checkpoint_dir)
    need = per * max(0, held - len(list_checkpoints(root)))
    if free_bytes is None:
        probe = root
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        free_bytes = shutil.disk_usage(probe).free
    if need > free_bytes:
        raise InputError(
            f"train_{mode}: its checkpoints need {_gb(need)} ({held} at once of {_gb(per)}: "
            f"{n / 1e9:.2f}B parameters x {per // n} bytes) under {root}, where {_gb(free_bytes)} are "
            f"free; set train.keep_checkpoints lower (0: none, a killed run starts over) or "
            f"train.checkpoint_every higher, or free space there")


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB"
