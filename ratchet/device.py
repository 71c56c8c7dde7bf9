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
    """`auto` -> `cuda` when a GPU is usable, else `numpy`; `cuda` without a GPU is an error."""
    if requested == "auto":
        return "cuda" if cuda_available() else "numpy"
    if requested == "cuda" and not cuda_available():
        raise InputError("config: engine.backend is 'cuda' but no CUDA GPU is usable through "
                           "CuPy (install ratchet[cuda] on a GPU machine, or use 'auto'/'numpy')")
    return requested
