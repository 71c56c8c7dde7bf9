"""A position-aware checksum of a tensor's stored bits, the same from NumPy and CuPy (and from
torch: ratchet/rl/telemetry.py `torch_checksum`, outside the torch-free engine), so
the trainer can check that the engine holds exactly its masters rounded (`sync/weights_parity`)
without copying either side: two sums over the 16-bit words, one weighted by the position in
a block of 2^16 words and one by the block, so no two changed words can cancel out."""

from __future__ import annotations

BLOCK = 1 << 16


def block_checksum(words, xp) -> tuple[int, int]:
    """`words`: a 1-D int16 array (NumPy or CuPy, `xp` its module) of a tensor's stored bits."""
    n = int(words.shape[0])
    blocks = -(-n // BLOCK)
    padded = xp.zeros(blocks * BLOCK, dtype=xp.int64)
    padded[:n] = words
    grid = padded.reshape(blocks, BLOCK)
    within = (grid.sum(axis=0) * (xp.arange(BLOCK, dtype=xp.int64) + 1)).sum()
    across = (grid.sum(axis=1) * (xp.arange(blocks, dtype=xp.int64) + 1)).sum()
    return int(within), int(across)

