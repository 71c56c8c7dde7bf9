"""A position-aware checksum of a tensor's stored bits, the same from NumPy and CuPy (and from
torch: ratchet/rl/telemetry.py `torch_checksum`, outside the torch-free engine), so
the trainer can check that the engine holds exactly its masters rounded (`sync/weights_parity`)
without copying either side: two sums over the 16-bit words, one weighted by the position in
a block of 2^16 words and one by the block, so no two changed words can cancel out."""

from __future__ import annotations

from itertools import pairwise

BLOCK = 1 << 16


def block_checksums(arrays, xp) -> list[tuple[int, int]]:
    """The checksum of each 1-D int16 array of `arrays` (NumPy or CuPy, `xp` its module). Arrays
    of one length are stacked and reduced together (a few launches for a whole model rather
    than a dozen a tensor), and everything is read back in one transfer."""
    groups: dict[int, list[int]] = {}
    for i, words in enumerate(arrays):
        groups.setdefault(int(words.shape[0]), []).append(i)
    tables, order = [], []
    for idx in groups.values():
        tables.append(stacked_sums(rows_of([arrays[i] for i in idx], xp), xp))
        order += idx
    if not tables:
        return []
    table = xp.concatenate(tables)
    table = table.get() if hasattr(table, "get") else table
    out: list = [None] * len(arrays)
    for i, (within, across) in zip(order, table.tolist()):
        out[i] = (int(within), int(across))
    return out


def rows_of(arrays, xp):
    """[g, n]: 1-D arrays of one length and dtype as the rows of one array. Where they are
    views of one allocation at one stride (one tensor a layer in a flat buffer, as the CUDA
    engine's weights), a strided view of it, each row exactly one array's bytes: no copy of
    the model (stacking copied ~1 GB at 0.5B on every sync); otherwise a stacked copy."""
    first = arrays[0]
    if len(arrays) > 1 and all(a.flags.c_contiguous and a.dtype == first.dtype for a in arrays):
        owners, starts = zip(*(_owner_and_start(a) for a in arrays))
        step = starts[1] - starts[0]
        if (all(o is owners[0] for o in owners) and step >= first.nbytes
                and all(b - a == step for a, b in pairwise(starts))):
            return xp.lib.stride_tricks.as_strided(first, shape=(len(arrays), first.shape[0]),
                                                   strides=(step, first.itemsize))
    return xp.stack(arrays)


def _owner_and_start(a) -> tuple[object, int]:
    """(the allocation `a` views, the address of its first element): CuPy or NumPy."""
    if hasattr(a.data, "ptr"):  # CuPy: a MemoryPointer into one Memory
        return a.data.mem, a.data.ptr
    root = a
    while isinstance(root.base, type(a)):
        root = root.base
    return (root if root.base is None else root.base), a.__array_interface__["data"][0]


def block_checksum(words, xp) -> tuple[int, int]:
    return block_checksums([words], xp)[0]


def stacked_sums(stacked, xp):
    """[g, n] int16 words -> [g, 2] int64 (within, across), with int64 accumulators (no widened
    copy of the words): the full blocks as a grid, the partial last block apart."""
    g, n = stacked.shape
    blocks, full = n // BLOCK, n // BLOCK * BLOCK
    grid = stacked[:, :full].reshape(g, blocks, BLOCK)
    tail = stacked[:, full:].astype(xp.int64)
    position = xp.arange(1, BLOCK + 1, dtype=xp.int64)
    within = (grid.sum(axis=1, dtype=xp.int64) * position).sum(axis=1) + (tail * position[:n - full]).sum(axis=1)
    across = ((grid.sum(axis=2, dtype=xp.int64) * xp.arange(1, blocks + 1, dtype=xp.int64)).sum(axis=1)
              + tail.sum(axis=1) * (blocks + 1))
    return xp.stack([within, across], axis=1)
