"""A position-aware checksum of a tensor's stored bits, the same from NumPy and CuPy (and from
torch: ratchet/rl/telemetry.py `torch_checksum`, outside the torch-free engine), so
the trainer can check that the engine holds exactly its masters rounded (`sync/weights_parity`)
without copying either side: two sums over the 16-bit words, one weighted by the position in
a block of 2^16 words and one by the block, so no two changed words can cancel out."""

from __future__ import annotations

BLOCK = 1 << 16


def block_checksums(arrays, xp) -> list[tuple[int, int]]:
    """The checksum of each 1-D int16 array of `arrays` (NumPy or CuPy, `xp` its module), read
    back in one transfer."""
    sums = [_block_sums(words, xp) for words in arrays]
    if not sums:
        return []
    table = xp.stack([xp.stack(pair) for pair in sums])  # [tensors, 2]
    table = table.get() if hasattr(table, "get") else table
    return [(int(a), int(b)) for a, b in table.tolist()]


def block_checksum(words, xp) -> tuple[int, int]:
    return block_checksums([words], xp)[0]


def _block_sums(words, xp):
    """Reduced in place with int64 accumulators (no widened copy): the full blocks as a grid,
    the partial last block apart."""
    n = int(words.shape[0])
    blocks, full = n // BLOCK, n // BLOCK * BLOCK
    grid = words[:full].reshape(blocks, BLOCK)
    tail = words[full:].astype(xp.int64)
    position = xp.arange(1, BLOCK + 1, dtype=xp.int64)
    within = (grid.sum(axis=0, dtype=xp.int64) * position).sum() + (tail * position[:n - full]).sum()
    across = ((grid.sum(axis=1, dtype=xp.int64) * xp.arange(1, blocks + 1, dtype=xp.int64)).sum()
              + tail.sum() * (blocks + 1))
    return within, across
