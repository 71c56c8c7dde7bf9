"""Launch plans of the decode step: how the attention (attention_decode.cu) cuts a step's
rows, kv heads and cached positions into blocks and splits, and which products split K.
Plain Python (no CuPy), so the CPU tests check the plans that the GPU runs."""

from __future__ import annotations

import numpy as np

DECODE_TILE = 64  # positions per tile in attention_decode.cu (#define TILE)
MAX_DECODE_SPLITS = 32
MMA_MAX_WARPS = 16  # attention_decode.cu MMA_MAX_WARPS: warps a block of attn_decode_mma (half at hd 128)
MMA_WARPS_MANY_ROWS = 4  # warps a block when the rows alone fill the GPU
MMA_TARGET_BLOCKS = 264  # many rows: ~2 blocks of MMA_WARPS_MANY_ROWS a multiprocessor of a 132-SM GPU
# Few rows: a block of up to 16 (head_dim 64) or 8 (128) warps holds a whole multiprocessor's
# registers (110 and 144 a thread, nvcc -Xptxas -v), so splits stop at one wave of such blocks:
# beyond it each wave adds its latency and the combine its launch (at Coder-1.5B shapes, B = 64,
# three splits and the combine cost 34 us a layer, twelfth session's profile).
MMA_ONE_WAVE = 132
MMA_SMEM_BYTES = 44 * 1024  # the merge's dynamic shared memory: with q_s (<= 4 KiB) under the 48 KiB default
# wo and w_down of a small decode bucket as K in SPLIT_K slices, one strided-batched product
# (ops.gemm_split) summed by the next add_rmsnorm (CudaBackend.split_products): at small M
# cuBLAS's own kernel leaves most multiprocessors idle (docs/KERNELS.md, runs 5 and 6).
# rmsnorm.cu instantiates its fast kernels for SPLIT_K slices.
SPLIT_K = 4
SPLIT_K_MAX_ROWS = 64
# rmsnorm.cu: add_rmsnorm_warp holds a row in RMS_WARP_VECTORS 16-byte vectors a lane (its #define
# RMS_VPL), add_rmsnorm_row a vector a thread in a block of at most RMS_ROW_THREADS (its #define)
RMS_WARP_VECTORS = 4
RMS_ROW_THREADS = 512


def decode_split(max_seq: int) -> tuple[int, int]:
    """(split_len, nsplit) for the decode attention: whole tiles, at most MAX_DECODE_SPLITS."""
    tiles = -(-max_seq // DECODE_TILE)
    per_split = -(-tiles // MAX_DECODE_SPLITS)
    split_len = per_split * DECODE_TILE
    return split_len, -(-max_seq // split_len)


def mma_decode_plan(rows: int, num_kv_heads: int, max_seq: int, head_dim: int, group: int,
                    capacity: int) -> tuple[int, int, int]:
    """(warps, split_len, nsplit) for attn_decode_mma: a block a (split, kv head, row), its
    warps taking tiles of 32 (head_dim 64) or 16 positions in turn.
    - Many rows (at least MMA_TARGET_BLOCKS (row, kv head) pairs): blocks of a few warps, one
      split, and the kernel writes the output (no combine).
    - Few rows: up to a warp a tile (a block merges its warps cheaply, in shared memory), then
      splits of the sequence (at most `capacity`, merged by the combine) while the blocks
      still fit one wave (MMA_ONE_WAVE): a row's splits only where rows alone leave
      multiprocessors idle."""
    tile = 32 if head_dim == 64 else 16
    tiles = -(-max_seq // tile)
    pairs = max(1, rows * num_kv_heads)
    if pairs >= MMA_TARGET_BLOCKS:
        warps, nsplit = MMA_WARPS_MANY_ROWS, 1
    else:
        fit = MMA_SMEM_BYTES // (4 * group * (head_dim + 2))
        warps = max(1, min(MMA_MAX_WARPS if head_dim == 64 else MMA_MAX_WARPS // 2, fit, tiles))
        nsplit = max(1, min(MMA_ONE_WAVE // pairs, capacity, -(-tiles // warps)))
    split_len = -(-tiles // nsplit) * tile
    return warps, split_len, -(-max_seq // split_len)


def rms_norm_kernel(dim: int, vec: int) -> tuple[str, int]:
    """The add_rmsnorm kernel for rows of `dim` values, `vec` to a 16-byte vector, and its
    threads a row: "warp" (a warp a row, up to 32 * RMS_WARP_VECTORS vectors), "row" (a block
    a row, a vector a thread, up to RMS_ROW_THREADS), else "block" (any width, 2-byte loads)."""
    if dim % vec == 0 and dim <= 32 * RMS_WARP_VECTORS * vec:
        return "warp", 32
    if dim % vec == 0 and dim // vec <= RMS_ROW_THREADS:
        return "row", -(-dim // vec // 32) * 32
    return "block", 256


TELEMETRY_CHUNK = 8192  # kernels/telemetry.cu TELEMETRY_CHUNK: values a block of sync_telemetry takes


def chunk_table(sizes, chunk: int = TELEMETRY_CHUNK) -> tuple[list[int], np.ndarray]:
    """Tensors of `sizes` values cut into chunks of `chunk` (a tensor's last one partial, an
    empty tensor none), numbered in order: each tensor's first chunk, and each chunk's tensor
    (int32), the table sync_telemetry (and convert_table) read a chunk's descriptor from."""
    counts = [-(-int(n) // chunk) for n in sizes]
    first = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int).tolist() if counts else []
    return first, np.repeat(np.arange(len(counts), dtype=np.int32), counts)


def chunk_descriptors(src_ptrs, dst_ptrs, sizes, chunk: int = TELEMETRY_CHUNK) -> tuple[np.ndarray, np.ndarray]:
    """(descriptors, table): a tensor's (source, destination, size, first chunk) as int64 [n, 4],
    the layout convert.cu's and telemetry.cu's chunked kernels read, and chunk_table's table."""
    first, table = chunk_table(sizes, chunk)
    return np.array(list(zip(src_ptrs, dst_ptrs, sizes, first)), dtype=np.int64).reshape(-1, 4), table


def split_k(rows: int, k: int) -> int:
    """K slices for a decode bucket's wo / w_down product of inner size k (0: one product)."""
    if rows <= SPLIT_K_MAX_ROWS and k % SPLIT_K == 0 and (k // SPLIT_K) % 8 == 0:
        return SPLIT_K
    return 0


def prefill_tiles(seq_rows: list[tuple[int, int, int, int]], head_dim: int,
                  group: int) -> tuple[np.ndarray, int]:
    """Tile descriptors int32 [n, 4] (first row, rows, slot, first position) of the prefill
    attention for sequences given as (first row, rows, slot, start position); returns them and
    the rows per tile."""
    ds = head_dim // 64 if head_dim > 64 else 1
    qt = max(1, 64 // (group * ds))
    tiles = []
    for row0, n, slot, pos0 in seq_rows:
        for i in range(0, n, qt):
            tiles.append((row0 + i, min(qt, n - i), slot, pos0 + i))
    return np.asarray(tiles, dtype=np.int32).reshape(-1, 4), qt
