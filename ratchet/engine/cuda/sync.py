"""In-place weight sync from the trainer: a torch fp32 CUDA tensor into an engine buffer.

`copy_into(engine_buffer, tensor)` sees the tensor through DLPack (`cupy.from_dlpack`, no
copy) and rounds it on the GPU, round-to-nearest-even, into the engine's fp16 / bf16 / fp32
buffer: bit for bit what `ratchet.model.dtypes.round_to` gives on the host (kernels/convert.cu).
torch is never imported here: the tensor brings its own `__dlpack__`.
"""

from __future__ import annotations

import cupy as cp
import numpy as np

from ratchet.engine.cuda import ops

BUFFER_DTYPES = {np.dtype(np.float32): "fp32", np.dtype(np.float16): "fp16", np.dtype(np.uint16): "bf16"}


def is_device_tensor(value) -> bool:
    """A GPU tensor from another framework (torch, ...): it speaks DLPack and is not NumPy."""
    if isinstance(value, np.ndarray) or not hasattr(value, "__dlpack__"):
        return False
    device = getattr(value, "__dlpack_device__", None)
    return device is not None and device()[0] in (2, 3)  # kDLCUDA, kDLCUDAHost


def copy_into(engine_buffer: cp.ndarray, tensor, dtype: str | None = None) -> None:
    """Round `tensor` (fp32, on this GPU, any framework with DLPack) into `engine_buffer`.

    `dtype` names the buffer's engine dtype; by default it follows the buffer's storage
    (float16 -> fp16, uint16 -> bf16 bit patterns, float32 -> fp32). Runs on CuPy's current
    stream, ordered after the producer's stream by the DLPack exchange."""
    dtype = dtype or BUFFER_DTYPES.get(engine_buffer.dtype)
    if dtype is None:
        raise ValueError(f"copy_into: engine buffer dtype {engine_buffer.dtype} is not an engine storage")
    if hasattr(tensor, "is_contiguous") and not tensor.is_contiguous():
        raise ValueError("copy_into: the source tensor must be contiguous")
    src = cp.from_dlpack(tensor.detach() if hasattr(tensor, "detach") else tensor)
    if src.dtype != np.float32:
        raise ValueError(f"copy_into: source dtype {src.dtype}, expected float32")
    if tuple(src.shape) != tuple(engine_buffer.shape):
        raise ValueError(f"copy_into: source shape {tuple(src.shape)} != buffer shape {tuple(engine_buffer.shape)}")
    if not engine_buffer.flags.c_contiguous or not src.flags.c_contiguous:
        raise ValueError("copy_into: both sides must be C-contiguous")
    ops.convert(src, engine_buffer, dtype)
