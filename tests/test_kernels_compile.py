"""The CUDA sources on a machine without a GPU: each kernels/*.cu compiles for sm_90 (with
nvcc, and with NVRTC, the compiler CuPy uses, where its library is found), the loader's
`#line` prefix and hashes, and the wall between the engine and its CUDA code: importing the
engine imports neither CuPy nor anything from ratchet/engine/cuda.
"""

from __future__ import annotations

import ctypes
import glob
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ratchet.engine.cuda import loader

ROOT = Path(__file__).resolve().parents[1]
KERNELS = sorted(p.stem for p in loader.KERNEL_DIR.glob("*.cu"))
# attention shapes (head_dim, group) to instantiate: Qwen2.5-0.5B, Llama-3-8B-like, two tiny ones
ATTN_SHAPES = ((64, 7), (128, 4), (128, 6), (128, 7), (32, 2), (16, 2))  # 0.5B, ..., Coder-1.5B, 7B


def test_every_operation_has_its_file():
    assert set(KERNELS) >= {"rmsnorm", "rope", "attention_decode", "attention_prefill", "swiglu", "sampler",
                            "embedding", "convert", "telemetry"}
    for name in KERNELS:
        loader.expressions(name)  # every file has its instances listed


def test_read_source_prepends_line_directive():
    for name in KERNELS:
        path = loader.kernel_path(name)
        src = loader.read_source(name)
        first, rest = src.split("\n", 1)
        assert first == f'#line 1 "{path}"'
        assert rest == path.read_text()


def test_source_hashes_cover_sources_and_headers():
    hashes = loader.source_hashes()
    assert sorted(hashes) == KERNELS
    assert all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes.values())
    deps = {p.name for p in loader._dependencies(loader.kernel_path("rmsnorm"))}
    assert deps == {"rmsnorm.cu", "dtype.cuh"}


def test_kernels_include_only_local_headers():
    for path in list(loader.KERNEL_DIR.glob("*.cu")) + list(loader.KERNEL_DIR.glob("*.cuh")):
        for line in path.read_text().splitlines():
            if line.lstrip().startswith("#include"):
                assert re.match(r'\s*#\s*include\s+"[\w.]+"', line), f"{path.name}: {line}"


def test_fast_math_is_refused_and_elementwise_kernels_skip_fma():
    for name in KERNELS:
        with pytest.raises(ValueError):
            loader.options(name, ("--use_fast_math",))
        assert not any("fast_math" in o for o in loader.options(name))
    for name in ("sampler", "rmsnorm", "rope", "swiglu", "convert", "telemetry"):
        assert "--fmad=false" in loader.options(name)


def test_engine_import_does_not_import_cuda_code():
    code = ("import sys, ratchet.engine, ratchet.engine.engine, ratchet.engine.backend, "
            "ratchet.engine.numpy.backend, ratchet.engine.sampler, ratchet.engine.rng\n"
            "print([m for m in sys.modules if m.startswith(('ratchet.engine.cuda', 'cupy', 'torch'))])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


@pytest.fixture(scope="module")
def nvcc_compiles(tmp_path_factory):
    """Every kernel's nvcc compile, all started at once (the machine's cores share them: the
    largest file alone takes ~25 s on two cores); each test waits for its own."""
    out_dir = tmp_path_factory.mktemp("nvcc")
    procs = {}
    for name in KERNELS:
        src = out_dir / f"{name}.cu"
        src.write_text(loader.nvcc_wrapper(name, loader.expressions(name, attn_shapes=ATTN_SHAPES)))
        cmd = ["nvcc", "-arch=sm_90", *loader.options(name), "-Xptxas", "-v", "-c", str(src),
               "-o", str(out_dir / f"{name}.o")]
        procs[name] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    yield procs
    for proc in procs.values():
        proc.kill()
        proc.communicate()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
@pytest.mark.parametrize("name", KERNELS)
def test_compiles_with_nvcc_sm90(name, nvcc_compiles):
    _, stderr = nvcc_compiles[name].communicate(timeout=900)
    assert nvcc_compiles[name].returncode == 0, stderr[-4000:]
    assert "warning" not in stderr.lower(), stderr[-4000:]


def _find_nvrtc() -> str | None:
    candidates = [os.environ.get("RATCHET_NVRTC_LIB", "")]
    for site in sys.path:
        candidates += sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib", "libnvrtc.so.*")))
        candidates += sorted(glob.glob(os.path.join(site, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so.*")))
    candidates += sorted(glob.glob("/usr/local/cuda*/lib64/libnvrtc.so*"))
    for c in candidates:
        if c and os.path.isfile(c) and "builtins" not in c and ".alt." not in c:
            return c
    return None


NVRTC = _find_nvrtc()


@pytest.mark.skipif(NVRTC is None, reason="no libnvrtc found (set RATCHET_NVRTC_LIB)")
@pytest.mark.parametrize("name", KERNELS)
def test_compiles_with_nvrtc_sm90(name):
    """What CuPy's RawModule does: the source with its #line, the loader's options, the names."""
    libdir = os.path.dirname(NVRTC)
    for builtins in glob.glob(os.path.join(libdir, "libnvrtc-builtins.so.*")):
        if ".alt." not in builtins:
            ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(NVRTC)
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), loader.read_source(name).encode(), f"{name}.cu".encode(),
                                  0, None, None) == 0
    for expr in loader.expressions(name, attn_shapes=ATTN_SHAPES):
        assert lib.nvrtcAddNameExpression(prog, expr.encode()) == 0
    opts = [o.encode() for o in loader.options(name)] + [b"-arch=sm_90"]
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    assert rc == 0, log.value.decode()[-4000:]


# Launched plainly, never through launch.pdl_kernel: the weight sync's conversion kernels, where
# griddepcontrol at the start slowed the sync (docs/KERNELS.md, run 6), and the sync telemetry's,
# launched once a sync from ratchet/engine/cuda/telemetry.py.
PLAIN_LAUNCH = {"convert.cu", "telemetry.cu"}


def test_every_kernel_waits_for_its_predecessor_first():
    """ratchet/engine/cuda/launch.py launches kernels with programmatic dependent launch: a
    kernel may then start before the previous one has finished, so every __global__ function's
    first statement must be pdl_begin() (griddepcontrol.wait before any memory access)."""
    import re

    from ratchet.engine.cuda import loader

    found = 0
    for path in sorted(loader.KERNEL_DIR.glob("*.cu")):
        if path.name in PLAIN_LAUNCH:
            continue
        text = path.read_text()
        for m in re.finditer(r"__global__[^;{]*?\)\s*\{", text, re.S):
            body = text[m.end():m.end() + 200].lstrip()
            assert body.startswith("pdl_begin();"), f"{path.name}: a kernel does not start with pdl_begin(): " \
                                                    f"{text[m.start():m.end()][:120]!r}"
            found += 1
    assert found >= 12
    ops = (ROOT / "ratchet/engine/cuda/ops.py").read_text() + (ROOT / "ratchet/engine/cuda/sync.py").read_text()
    assert not re.search(r"pdl_kernel\([^)]*convert", ops), "convert.cu's kernels must launch plainly"
    assert "pdl_kernel" not in (ROOT / "ratchet/engine/cuda/telemetry.py").read_text()
