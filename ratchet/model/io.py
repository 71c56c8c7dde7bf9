"""A converted model on disk: the engine weights, their shape, a manifest and the tokenizer.

    model_dir/
      model.safetensors       the engine names, stored in the engine dtype (fp32, fp16 or bf16)
      config.json             ModelConfig.to_dict() plus "engine_dtype"
      manifest.json           dtype, parameter count, SHA-256 of the file and of each tensor's bytes
                              (+ snap_to and its count when the source was snapped to a grid)
      tokenizer.json, tokenizer_config.json, ...   copied from the source

In memory the weights are float32 NumPy arrays whose values lie on the engine dtype's grid, so
the engine (no torch) and the trainer (torch) read the same directory the same way.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ratchet.errors import InputError, MissingInputError
from ratchet.model import safetensors_io
from ratchet.model.config import ModelConfig
from ratchet.model.layout import DTYPES, check_weights, expected_shapes, num_parameters

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
MANIFEST_FILE = "manifest.json"
# Files the tokenizer directory may hold that are not the tokenizer: never copied.
NOT_TOKENIZER = {CONFIG_FILE, MANIFEST_FILE, "model.safetensors.index.json"}
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5")
MAX_TOKENIZER_FILE_BYTES = 64 << 20  # a Qwen tokenizer.json is 7 MB; anything far larger is weights


@dataclass
class EngineModel:
    cfg: ModelConfig
    weights: dict[str, np.ndarray]  # float32, values on the `dtype` grid
    dtype: str
    path: Path | None = None


def save_engine_model(out_dir: str | Path, cfg: ModelConfig, weights: dict[str, np.ndarray],
                      dtype: str, tokenizer_dir: str | Path | None = None,
                      manifest_extra: dict | None = None) -> Path:
    """Write a model directory; an existing `out_dir` is replaced only once the new one is whole.
    `manifest_extra`: keys added to the manifest (how the weights were made, e.g. `snap_to`)."""
    if dtype not in DTYPES:
        raise InputError(f"save_engine_model: dtype {dtype!r} is not one of {DTYPES}")
    out_dir = Path(out_dir)
    check_weights(cfg, weights, f"save_engine_model({out_dir})")
    # In layout order, so one model always gives one file; `safetensors_io.save` rounds to
    # `dtype` by the same round-to-nearest-even rule as `round_to` (no extra fp32 copy here).
    ordered = {name: weights[name] for name in expected_shapes(cfg)}

    tmp = temporary_dir(out_dir)
    try:
        start = time.perf_counter()
        safetensors_io.save(tmp / WEIGHTS_FILE, ordered, dtype)
        written = time.perf_counter() - start
        config = cfg.to_dict() | {"engine_dtype": dtype}
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
        with ThreadPoolExecutor(max_workers=1) as pool:  # the file's one sequential pass beside the tensors'
            whole = pool.submit(file_sha256, tmp / WEIGHTS_FILE)
            tensors = tensor_hashes(tmp / WEIGHTS_FILE)
            manifest = {"dtype": dtype, "num_parameters": num_parameters(cfg), "file_sha256": whole.result(),
                        "tensors": tensors} | (manifest_extra or {})
        size = (tmp / WEIGHTS_FILE).stat().st_size
        print(f"[save_engine_model] {size / 1e9:.2f} GB written in {written:.1f} s "
              f"({size / 1e6 / max(written, 1e-9):.0f} MB/s), hashed in {time.perf_counter() - start - written:.1f} s")
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
        if tokenizer_dir is not None:
            copy_tokenizer_files(tokenizer_dir, tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    replace_dir(tmp, out_dir)
    for path in sorted(out_dir.iterdir()):
        print(f"wrote {path}")
    return out_dir


def load_engine_model(model_dir: str | Path, verify: bool = True) -> EngineModel:
    """Read a model directory written by `save_engine_model`.

    `verify` checks the weights file against the manifest's per-tensor SHA-256 (threaded).
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise MissingInputError(f"model directory not found: {model_dir}")
    config_path, weights_path = model_dir / CONFIG_FILE, model_dir / WEIGHTS_FILE
    for path in (config_path, weights_path):
        if not path.is_file():
            raise MissingInputError(f"{model_dir}: missing {path.name}")
    print(f"reading {config_path}")
    cfg = ModelConfig.load(config_path)
    dtype = json.loads(config_path.read_text()).get("engine_dtype")
    if dtype not in DTYPES:
        raise InputError(f"{config_path}: engine_dtype {dtype!r} is not one of {DTYPES}")
    if verify:
        verify_manifest(model_dir, dtype)
    print(f"reading {weights_path}")
    weights = safetensors_io.load_fp32(weights_path)
    check_weights(cfg, weights, str(weights_path))
    return EngineModel(cfg=cfg, weights=weights, dtype=dtype, path=model_dir)


def verify_manifest(model_dir: Path, dtype: str | None = None) -> None:
    """Raise naming the first tensor whose stored bytes differ from the manifest. Each tensor is
    hashed on its own, on a few threads, against the manifest's per-tensor SHA-256, and the
    header must hold exactly those tensors in `dtype`'s storage, packed end to end: what
    `load_fp32` reads is then what was written. (The whole file's SHA-256 is one sequential
    pass: 2.5 s at 1.5B on the 2-core machine, ~6 s on the GPU machine, at every load.)"""
    manifest_path, weights_path = model_dir / MANIFEST_FILE, model_dir / WEIGHTS_FILE
    if not manifest_path.is_file():
        raise MissingInputError(f"{model_dir}: missing {MANIFEST_FILE} (load with verify=False to skip it)")
    print(f"reading {manifest_path}")
    listed = json.loads(manifest_path.read_text())["tensors"]
    header, start = safetensors_io.read_header(weights_path)
    for name in listed:
        if name not in header:
            raise InputError(f"{weights_path}: tensor {name!r} listed in {MANIFEST_FILE} is missing")
    extra = [name for name in header if name not in listed]
    if extra:
        raise InputError(f"{weights_path}: tensor {extra[0]!r} is not listed in {MANIFEST_FILE}")
    code = safetensors_io.storage_code(dtype) if dtype is not None else None
    end = 0
    for name, info in sorted(header.items(), key=lambda item: item[1]["data_offsets"][0]):
        if code is not None and info["dtype"] != code:
            raise InputError(f"{weights_path}: tensor {name!r} is stored as {info['dtype']}, "
                             f"not {code} ({dtype}, as config.json says)")
        if info["data_offsets"][0] != end:
            raise InputError(f"{weights_path}: tensor {name!r} does not start where the one before "
                             f"it ends (byte {info['data_offsets'][0]}, not {end})")
        end = info["data_offsets"][1]
    if start + end != weights_path.stat().st_size:
        raise InputError(f"{weights_path}: {weights_path.stat().st_size - start - end} bytes after the "
                         f"last tensor that {MANIFEST_FILE} does not list")
    got = tensor_hashes(weights_path)
    for name, want in listed.items():
        if got[name] != want:
            raise InputError(f"{weights_path}: tensor {name!r} does not match {MANIFEST_FILE} "
                             f"(shape {got[name]['shape']} sha256 {got[name]['sha256'][:12]}..., "
                             f"expected shape {want['shape']} sha256 {want['sha256'][:12]}...)")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(16 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def tensor_hashes(path: Path) -> dict[str, dict]:
    """{name: {"shape", "sha256"}} over each tensor's bytes exactly as stored in the file,
    tensors on a few threads (hashlib releases the GIL on large buffers)."""
    header, start = safetensors_io.read_header(path)
    data = np.memmap(path, dtype=np.uint8, mode="r")

    def one(info: dict) -> dict:
        a, b = info["data_offsets"]
        return {"shape": list(info["shape"]), "sha256": hashlib.sha256(data[start + a: start + b]).hexdigest()}

    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        return dict(zip(header, pool.map(one, header.values())))


def copy_tokenizer_files(src_dir: str | Path, dst_dir: Path) -> None:
    """Copy every small non-weight file of `src_dir` (tokenizer.json, tokenizer_config.json, ...)."""
    src_dir = Path(src_dir)
    if not src_dir.is_dir():
        raise MissingInputError(f"tokenizer directory not found: {src_dir}")
    if not (src_dir / "tokenizer.json").is_file():
        raise MissingInputError(f"{src_dir}: missing tokenizer.json")
    for path in sorted(src_dir.iterdir()):
        if (not path.is_file() or path.name in NOT_TOKENIZER or path.name.startswith(".")
                or path.name.endswith(WEIGHT_SUFFIXES)
                or path.stat().st_size > MAX_TOKENIZER_FILE_BYTES):
            continue
        print(f"reading {path}")
        shutil.copyfile(path, dst_dir / path.name)
    inline_chat_template(dst_dir)


def inline_chat_template(tokenizer_dir: Path) -> None:
    """Move chat_template.jinja (where transformers 5 saves the template) into
    tokenizer_config.json, the one place `load_tokenizer` looks for it."""
    config_path, jinja = tokenizer_dir / "tokenizer_config.json", tokenizer_dir / "chat_template.jinja"
    if not (config_path.is_file() and jinja.is_file()):
        return
    config = json.loads(config_path.read_text())
    config.setdefault("chat_template", jinja.read_text())
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    jinja.unlink()


def temporary_dir(out_dir: Path) -> Path:
    """A new `.<name>.tmp-<pid>` beside `out_dir`, for `replace_dir`, once the temporaries and
    old copies a killed writer left there (each a whole model) are removed."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    stale = re.compile(rf"\.{re.escape(out_dir.name)}\.(tmp|old)-\d+")
    for path in out_dir.parent.glob(f".{out_dir.name}.*-*"):
        if path.is_dir() and stale.fullmatch(path.name):
            shutil.rmtree(path, ignore_errors=True)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    tmp.mkdir()
    return tmp


def replace_dir(new: Path, target: Path) -> None:
    """Put `new` at `target`: two renames, so a reader never sees a half-written directory."""
    if not target.exists():
        os.replace(new, target)
        return
    old = target.with_name(f".{target.name}.old-{os.getpid()}")
    if old.exists():
        shutil.rmtree(old)
    os.replace(target, old)
    os.replace(new, target)
    shutil.rmtree(old)
