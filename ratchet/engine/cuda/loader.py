"""Compile `kernels/<name>.cu` with NVRTC through CuPy (httomolibgpu's pattern): `#line 1`
prefixed so errors point at the real file, templates instantiated by name, modules cached per
(source hash, options, names, device); never `--use_fast_math`, and `--fmad=false` for the
element-wise kernels, so their fp32 arithmetic rounds as the NumPy backend's does."""

from __future__ import annotations

import hashlib
import os
import re
from importlib import resources
from pathlib import Path

from ratchet.engine.cuda.plan import SPLIT_K

# the sources ship inside the package (a wheel has them too); RATCHET_KERNEL_DIR points elsewhere
KERNEL_DIR = Path(os.environ.get("RATCHET_KERNEL_DIR") or str(resources.files("ratchet.engine.cuda") / "kernels"))

BASE_OPTIONS = ("-std=c++17",)
# Element-wise kernels: no fused multiply-add, so each fp32 product and sum rounds on its own.
NO_FMA = ("rmsnorm", "rope", "swiglu", "convert", "telemetry", "embedding", "sampler")
FORBIDDEN_OPTIONS = ("--use_fast_math", "-use_fast_math")

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)
_modules: dict = {}
_files: dict = {}  # path -> (mtime_ns, size, text): a launch path must not re-read and re-hash


def _read(path: Path) -> str:
    st = path.stat()
    hit = _files.get(path)
    if hit is None or hit[:2] != (st.st_mtime_ns, st.st_size):
        hit = _files[path] = (st.st_mtime_ns, st.st_size, path.read_text())
    return hit[2]


def kernel_path(name: str) -> Path:
    path = KERNEL_DIR / f"{name}.cu"
    if not path.is_file():
        raise FileNotFoundError(f"CUDA kernel source not found: {path}")
    return path


def _dependencies(path: Path, seen: set | None = None) -> list[Path]:
    """The file and every file it `#include "..."`s from the kernel directory, recursively."""
    seen = set() if seen is None else seen
    if path in seen:
        return []
    seen.add(path)
    out = [path]
    for inc in _INCLUDE.findall(_read(path)):
        dep = path.parent / inc
        if dep.is_file():
            out += _dependencies(dep, seen)
    return out


def source_hash(name: str) -> str:
    """SHA-256 over the kernel source and the headers it includes."""
    h = hashlib.sha256()
    for dep in _dependencies(kernel_path(name)):
        h.update(dep.name.encode() + b"\0" + _read(dep).encode() + b"\0")
    return h.hexdigest()


def source_hashes() -> dict[str, str]:
    """{kernel name: source hash} for every `kernels/*.cu`: the record of what was built."""
    return {p.stem: source_hash(p.stem) for p in sorted(KERNEL_DIR.glob("*.cu"))}


def read_source(name: str) -> str:
    """The source as compiled: `#line 1 "<path>"`, then the file."""
    path = kernel_path(name)
    return f'#line 1 "{path}"\n' + _read(path)


def options(name: str, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    opts = BASE_OPTIONS + (f"-I{KERNEL_DIR}",) + (("--fmad=false",) if name in NO_FMA else ()) + tuple(extra)
    bad = [o for o in opts if o in FORBIDDEN_OPTIONS]
    if bad:
        raise ValueError(f"kernel {name}: option {bad[0]} is not allowed (accurate maths only)")
    return opts


def load(name: str, name_expressions: tuple[str, ...] | list[str] = (), extra_options: tuple[str, ...] = ()):
    """The compiled `cupy.RawModule` of `kernels/<name>.cu` on the current device (cached)."""
    import cupy

    exprs = tuple(name_expressions)
    opts = options(name, tuple(extra_options))
    key = (name, source_hash(name), opts, exprs, cupy.cuda.runtime.getDevice())
    module = _modules.get(key)
    if module is None:
        module = cupy.RawModule(code=read_source(name), options=opts,
                                name_expressions=exprs or None)
        if hasattr(module, "compile"):
            module.compile()  # surface compiler errors here, not at the first launch
        _modules[key] = module
    return module


def load_many(specs: list[tuple[str, tuple[str, ...]]]) -> list:
    """`load(name, name_expressions)` of each spec, on threads (NVRTC compiles without the GIL):
    with a cold kernel cache an engine's start waits for its slowest module, not their sum."""
    from concurrent.futures import ThreadPoolExecutor

    import cupy

    device = cupy.cuda.runtime.getDevice()  # each thread's own current device is 0

    def one(spec):
        with cupy.cuda.Device(device):
            return load(*spec)

    with ThreadPoolExecutor(max_workers=max(1, min(len(specs), os.cpu_count() or 1, 8))) as pool:
        return list(pool.map(one, specs))


def function(name: str, expr: str, all_exprs: tuple[str, ...] | list[str] | None = None):
    """One kernel: `function("rmsnorm", "add_rmsnorm<F16>")`."""
    exprs = tuple(all_exprs) if all_exprs is not None else (expr,)
    if expr not in exprs:
        exprs = exprs + (expr,)
    module = load(name, exprs)
    return module.get_function(expr)


DTYPE_TAGS = {"fp32": "F32", "fp16": "F16", "bf16": "BF16"}


def tensor_core_decode(dtype: str, head_dim: int, group: int) -> bool:
    """Whether `attn_decode_mma` (attention_decode.cu) covers this engine dtype and shape."""
    return dtype in ("fp16", "bf16") and head_dim in (64, 128) and 1 <= group <= 16


def expressions(name: str, dtypes=("fp32", "fp16", "bf16"), attn_shapes=((64, 7),)) -> tuple[str, ...]:
    """The template instances of one kernel file for the given dtypes and (head_dim, group)."""
    tags = [DTYPE_TAGS[d] for d in dtypes]
    if name in ("sampler", "staging"):  # extern "C", no templates
        return ()
    if name == "convert":
        return ("convert_f32<0>", "convert_f32<1>", "convert_many<0>", "convert_many<1>", "convert_many<2>",
                "convert_table<0, 8192, 4, 0>", "convert_table<1, 8192, 4, 0>", "convert_table<2, 8192, 4, 0>",
                "convert_tiles<0, 2>", "convert_tiles<1, 2>", "convert_tiles<0, 4>", "convert_tiles<1, 4>")
    if name == "telemetry":  # masters rounded to fp16, to bf16; held 16-bit words
        return ("sync_telemetry<0>", "sync_telemetry<1>", "sync_telemetry<3>")
    if name == "attention_decode":
        general = tuple(f"attn_decode_{part}<{t}, {hd}, {g}>" for t in tags for hd, g in attn_shapes
                        for part in ("partial", "combine"))
        return general + tuple(f"attn_decode_mma<{DTYPE_TAGS[d]}, {hd}, {g}>" for d in dtypes
                               for hd, g in attn_shapes if tensor_core_decode(d, hd, g))
    if name == "attention_prefill":
        return tuple(f"attn_prefill<{t}, {hd}, {g}>" for t in tags for hd, g in attn_shapes)
    if name == "rmsnorm":  # the block kernel, then the warp and row kernels without and with a split's slices
        return tuple(e for t in tags for e in (f"add_rmsnorm<{t}>",
                                               *(f"add_rmsnorm_{k}<{t}, {p}>"
                                                 for k in ("warp", "row") for p in (0, SPLIT_K))))
    entry = {"rope": ("rope_qkv",),
             "swiglu": ("swiglu", "swiglu_vec"), "embedding": ("embedding",)}
    if name not in entry:
        raise KeyError(f"unknown kernel {name!r}")
    return tuple(f"{e}<{t}>" for t in tags for e in entry[name])


def nvcc_wrapper(name: str, exprs: tuple[str, ...]) -> str:
    """A translation unit for nvcc that includes the kernel and takes each instance's address,
    so `nvcc -arch=sm_90 -c` compiles the same device code NVRTC would (used by the CPU test)."""
    lines = [read_source(name), "", f'#line 1 "{name}_instances"']
    lines += [f"void* ratchet_instance_{i} = (void*)&{e};" for i, e in enumerate(exprs)]
    return "\n".join(lines) + "\n"
