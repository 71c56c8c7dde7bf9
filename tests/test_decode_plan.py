"""The decode attention's launch plans (ratchet/engine/cuda/plan.py), on the CPU: every plan
covers the cache with whole tiles, fits the workspace the backend allocates and the kernel's
launch bounds and shared memory, and matches the constants in attention_decode.cu."""

from __future__ import annotations

import itertools
import re

import pytest

from ratchet.engine.cuda import loader, plan

SOURCE = loader.kernel_path("attention_decode").read_text()


def _define(name: str) -> int:
    return int(re.search(rf"#define {name} (\d+)", SOURCE).group(1))


def test_constants_match_the_kernel():
    assert plan.DECODE_TILE == _define("TILE")
    assert plan.MMA_MAX_WARPS == _define("MMA_MAX_WARPS")
    assert "HD == 64 ? 32 : 16" in SOURCE  # the tensor-core kernel's positions a warp step
    assert "HD == 64 ? MMA_MAX_WARPS * 32 : MMA_MAX_WARPS * 16" in SOURCE  # its launch bounds


@pytest.mark.parametrize("hd,group", [(64, 7), (128, 4), (128, 16), (64, 1), (64, 16)])
def test_every_plan_covers_the_cache_and_fits(hd, group):
    tile = 32 if hd == 64 else 16
    max_warps = plan.MMA_MAX_WARPS if hd == 64 else plan.MMA_MAX_WARPS // 2
    for rows, kv, max_seq in itertools.product((1, 3, 8, 64, 100, 512, 1024), (1, 2, 4, 8),
                                               (1, 17, 64, 300, 384, 2500, 4096, 32768)):
        capacity = plan.decode_split(max_seq)[1]  # the backend's part_acc holds this many splits
        warps, split_len, nsplit = plan.mma_decode_plan(rows, kv, max_seq, hd, group, capacity)
        case = (rows, kv, max_seq, warps, split_len, nsplit)
        assert split_len % tile == 0, case
        assert (nsplit - 1) * split_len < max_seq <= nsplit * split_len, case
        assert 1 <= nsplit <= capacity, case
        assert 1 <= warps <= max_warps, case
        assert 4 * warps * group * (hd + 2) <= plan.MMA_SMEM_BYTES, case  # the merge's dynamic smem
        if rows * kv >= plan.MMA_TARGET_BLOCKS:
            assert nsplit == 1, case  # the kernel writes the output, no combine
        if nsplit > 1:
            assert rows * kv * nsplit <= plan.MMA_ONE_WAVE, case  # splits only within one wave


def test_qwen05_decode_plans():
    """The plans the H200 bench measured (results/records/h200-bench.json): B = 64 at a
    384-position cache, a block of 12 warps a (row, kv head), one 32-position tile a warp;
    B = 512, blocks of 4 warps; both without the combine."""
    cap = plan.decode_split(384)[1]
    assert plan.mma_decode_plan(64, 2, 384, 64, 7, cap) == (12, 384, 1)
    assert plan.mma_decode_plan(512, 2, 384, 64, 7, cap) == (4, 384, 1)
    assert plan.mma_decode_plan(1, 2, 4096, 64, 7, plan.decode_split(4096)[1])[2] > 1  # long, few rows: splits


def test_decode_plans_past_the_bench():
    """What the engine runs beyond the bench's 384-position cache: the profiles' 1,024, the
    split training's 128-row bucket, Coder-1.5B's head_dim 128 (6 query heads a kv head).
    128 or more (row, kv head) pairs fill a wave without splits, so no combine; 32 rows, two
    splits; one long row, as many splits as a wave and the workspace allow."""
    for max_seq in (384, 1024):
        cap = plan.decode_split(max_seq)[1]
        assert plan.mma_decode_plan(64, 2, max_seq, 64, 7, cap)[2] == 1
        assert plan.mma_decode_plan(128, 2, max_seq, 64, 7, cap)[2] == 1
        assert plan.mma_decode_plan(64, 2, max_seq, 128, 6, cap) == (8, max_seq, 1)
        assert plan.mma_decode_plan(32, 2, max_seq, 128, 6, cap)[2] == 2
    assert plan.mma_decode_plan(1, 2, 32768, 128, 6, plan.decode_split(32768)[1])[2] == plan.decode_split(32768)[1]


def test_tensor_core_instances_only_where_supported():
    exprs = loader.expressions("attention_decode", attn_shapes=((64, 7), (32, 2), (128, 20)))
    mma = {e for e in exprs if e.startswith("attn_decode_mma")}
    assert mma == {"attn_decode_mma<F16, 64, 7>", "attn_decode_mma<BF16, 64, 7>"}
    assert loader.tensor_core_decode("fp16", 128, 16) and not loader.tensor_core_decode("fp32", 64, 7)


def test_split_k_plan_and_its_kernel_instance():
    """The split-K decode products (plan.split_k, on by default): Qwen2.5-0.5B's wo (K 896) and
    w_down (K 4864) split in SPLIT_K slices of a multiple of 8 up to SPLIT_K_MAX_ROWS rows, and
    rmsnorm.cu is instantiated for that many slices."""
    assert plan.split_k(64, 896) == plan.split_k(1, 4864) == plan.SPLIT_K
    assert plan.split_k(plan.SPLIT_K_MAX_ROWS + 1, 896) == 0  # big buckets: cuBLAS's own product
    assert plan.split_k(64, 100) == 0  # 25-wide slices would break 16-byte alignment
    for k in (896, 4864, 320, 512):
        s = plan.split_k(8, k)
        assert s and k % s == 0 and (k // s) % 8 == 0
    assert f"add_rmsnorm_warp<F16, {plan.SPLIT_K}>" in loader.expressions("rmsnorm")


def test_rmsnorm_kernel_by_row_width():
    """A warp a row up to 1,024 values of a 16-bit type (Qwen2.5-0.5B's 896), a block a row of a
    vector a thread up to 4,096 (Coder-1.5B's 1536, Qwen2.5-7B's 3584, in whole warps), the block
    kernel past that and off the 16-byte grid. Every kernel chosen has its instances compiled."""
    kinds = {d: plan.rms_norm_kernel(d, 8) for d in (896, 1024, 1032, 1536, 3584, 4096, 4104, 900)}
    assert kinds == {896: ("warp", 32), 1024: ("warp", 32), 1032: ("row", 160), 1536: ("row", 192),
                     3584: ("row", 448), 4096: ("row", 512), 4104: ("block", 256), 900: ("block", 256)}
    assert [plan.rms_norm_kernel(d, 4)[0] for d in (512, 896, 2048, 2052)] == ["warp", "row", "row", "block"]
    for dim in range(8, 5000, 8):  # a row kernel's block covers the row in whole warps, within its bound
        kind, threads = plan.rms_norm_kernel(dim, 8)
        if kind == "row":
            assert threads % 32 == 0 and dim // 8 <= threads <= plan.RMS_ROW_THREADS
    norm = loader.kernel_path("rmsnorm").read_text()
    assert f"#define RMS_VPL {plan.RMS_WARP_VECTORS}" in norm and f"#define RMS_ROW_THREADS {plan.RMS_ROW_THREADS}" in norm
    exprs = loader.expressions("rmsnorm", ("fp16",))
    for kind in ("warp", "row"):
        for p in (0, plan.SPLIT_K):
            assert f"add_rmsnorm_{kind}<F16, {p}>" in exprs


def test_decode_buckets_are_the_powers_of_two_up_to_the_batch():
    from ratchet.engine.cuda.graphs import buckets_for

    assert buckets_for(64) == [1, 2, 4, 8, 16, 32, 64]
    assert buckets_for(100) == [1, 2, 4, 8, 16, 32, 64, 128]
    assert buckets_for(512) == [2 ** k for k in range(10)]
    assert buckets_for(1) == [1]


def test_the_telemetry_kernels_chunk_walk_gives_the_checksums():
    """sync_telemetry (kernels/telemetry.cu) as NumPy: chunks from plan.chunk_table, each value's
    place in its tensor from its chunk, the two position-weighted sums as the kernel forms them
    (i & 0xffff, i >> 16) equal ratchet.model.checksum's, at sizes around a chunk and a block."""
    import numpy as np

    from ratchet.model.checksum import BLOCK, block_checksums

    kernel = loader.kernel_path("telemetry").read_text()
    assert f"#define TELEMETRY_CHUNK {plan.TELEMETRY_CHUNK}" in kernel
    assert f"#define CHECKSUM_BLOCK_BITS {BLOCK.bit_length() - 1}" in kernel
    rng = np.random.default_rng(0)
    sizes = [0, 1, 8191, 8192, 8193, 2 * BLOCK + 5, 200_000, 3]
    arrays = [rng.integers(-32768, 32768, n).astype(np.int16) for n in sizes]
    first, table = plan.chunk_table(sizes)
    assert len(table) == sum(-(-n // plan.TELEMETRY_CHUNK) for n in sizes) and table.dtype == np.int32
    sums = np.zeros((len(sizes), 2), dtype=np.int64)
    for c, d in enumerate(table):
        begin = (c - first[d]) * plan.TELEMETRY_CHUNK
        i = np.arange(begin, min(begin + plan.TELEMETRY_CHUNK, sizes[d]), dtype=np.int64)
        w = arrays[d][i].astype(np.int64)
        sums[d] += [(w * ((i & (BLOCK - 1)) + 1)).sum(), (w * ((i >> 16) + 1)).sum()]
    assert [tuple(s) for s in sums.tolist()] == block_checksums(arrays, np)
    first, table = plan.chunk_table([])
    assert first == [] and table.size == 0


def test_chunk_descriptors_are_the_sync_loops():
    """plan.chunk_descriptors, the (source, destination, size, first chunk) rows convert.cu's and
    telemetry.cu's chunked kernels read, as the sync's own loop made them before it shared them."""
    import numpy as np

    sizes, chunk = [5, 0, 4096, 4097, 1], 4096
    src, dst = [1000 + 16 * i for i in range(5)], [9000 + 8 * i for i in range(5)]
    desc, table = plan.chunk_descriptors(src, dst, sizes, chunk)
    want, chunk0 = np.empty((5, 4), dtype=np.int64), 0
    for i, (s, d, n) in enumerate(zip(src, dst, sizes)):
        want[i] = (s, d, n, chunk0)
        chunk0 += -(-n // chunk)
    assert desc.dtype == np.int64 and np.array_equal(desc, want)
    assert table.tolist() == [0, 2, 3, 3, 4] and len(table) == chunk0
    desc, table = plan.chunk_descriptors([], [], [], chunk)
    assert desc.shape == (0, 4) and table.size == 0
