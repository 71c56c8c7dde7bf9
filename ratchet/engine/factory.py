"""The backend factory: the one module that knows every backend, so that the protocol
(backend.py) imports none and the backends can import its helpers without a cycle."""

from __future__ import annotations

from ratchet.engine.backend import Backend
from ratchet.model.config import ModelConfig

BACKENDS = ("numpy", "cuda")


def make_backend(name: str, cfg: ModelConfig, dtype: str, max_batch_size: int,
                 max_seq_len: int, batch_invariant: bool = False, device: int | None = None) -> Backend:
    """The backend called `name`, empty (no weights yet); batch-invariant on request. The CUDA
    backend is imported only when asked for (CuPy is an optional dependency)."""
    if name == "numpy":
        from ratchet.engine.numpy.backend import NumpyBackend

        return NumpyBackend(cfg, dtype, max_batch_size, max_seq_len)
    if name == "cuda":
        try:
            from ratchet.engine.cuda.backend import CudaBackend
        except ImportError as e:
            raise ImportError(f"the cuda backend cannot be loaded ({e}); it needs CuPy and a GPU "
                              "(pip install 'ratchet[cuda]')") from e
        return CudaBackend(cfg, dtype, max_batch_size, max_seq_len, batch_invariant=batch_invariant,
                           device=device)
    raise ValueError(f"unknown engine backend {name!r}; expected one of {BACKENDS}")
