"""What hardware a stage runs on and which engine backend that allows; CuPy is imported only
to ask, and only if installed, so a CPU machine never imports CUDA code."""

from __future__ import annotations

import functools
import importlib.util
import platform

from ratchet.errors import InputError


@functools.cache
def cuda_available() -> bool:
    if importlib.util.find_spec("cupy") is None:
        return False
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no driver, no device: CuPy raises its own error types
        return False


def gpu_name() -> str | None:
    if not cuda_available():
        return None
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    name = props["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def describe() -> str:
    return gpu_name() or f"cpu ({platform.processor() or platform.machine()})"


def resolve_backend(requested: str) -> str:
    """`auto` -> `cuda` when a GPU is usable, else `numpy`; `cuda` without a GPU is an error,
    and so is `vllm` (only ever by name) without vLLM or without a GPU."""
    if requested == "auto":
        return "cuda" if cuda_available() else "numpy"
    if requested == "vllm":
        check_vllm()
    if requested == "cuda" and not cuda_available():
        raise InputError("config: engine.backend is 'cuda' but no CUDA GPU is usable through "
                           "CuPy (install ratchet[cuda] on a GPU machine, or use 'auto'/'numpy')")
    return requested


def check_vllm() -> None:
    """Refuse `engine.backend: vllm` where it cannot start, before any work."""
    problem = vllm_problem()
    if problem is not None:
        raise InputError(f"config: engine.backend is 'vllm' but {problem}")


def vllm_problem() -> str | None:
    """Why vLLM cannot run here, or None: not importable, or no CUDA GPU for it."""
    error = _vllm_import_error()
    if error is not None:
        return (f"vLLM cannot be imported ({error}); pip install 'ratchet[vllm]' on a CUDA "
                "machine, or install the wheelhouse as dev/gpu/vllm.sh does, or use 'auto'")
    if not _torch_cuda_available():
        return "no CUDA GPU is usable through torch (vLLM needs one; use 'auto' or 'numpy')"
    return None


def _vllm_import_error() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return "No module named 'vllm'"
    try:
        import vllm  # noqa: F401
    except Exception as e:  # a broken install: CUDA libraries, a torch it was not built for
        return f"{type(e).__name__}: {e}"
    return None


def _torch_cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()
