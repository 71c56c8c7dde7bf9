"""Prefill on the GPU: any number of sequences packed into passes of up to `chunk` rows (the
LM head only on each sequence's last row), or, on a batch-invariant backend, by decode steps
so that a prompt's cache comes from the same kernels as its answer's tokens."""

from __future__ import annotations

import cupy as cp
import numpy as np

from ratchet.engine.cuda.forward import LayerLoop, Workspace
from ratchet.engine.cuda.staging import NUM_FIELDS, POSITIONS, SLOTS, TOKENS

PREFILL_CHUNK = 4096  # rows per prefill pass: bounds the activation buffers


def prefill_passes(seqs, chunk: int):
    """`seqs` [(slot, ids, start)] cut into passes of <= chunk rows: each pass a list of
    pieces (sequence index, slot, ids, start, is_last)."""
    passes, cur, rows = [], [], 0
    for i, (slot, ids, start) in enumerate(seqs):
        off = 0
        while off < len(ids):
            take = min(len(ids) - off, chunk - rows)
            cur.append((i, slot, ids[off:off + take], start + off, off + take == len(ids)))
            rows, off = rows + take, off + take
            if rows == chunk:
                passes.append(cur)
                cur, rows = [], 0
    if cur:
        passes.append(cur)
    return passes


def run_packed_pass(layers: LayerLoop, stream, pieces, logits_out: cp.ndarray) -> None:
    """One pass of `prefill_passes`: every piece's k, v into the cache, and the logits of each
    sequence that ends in it into its row of `logits_out`."""
    cfg, ops = layers.cfg, layers.ops
    rows = sum(len(p[2]) for p in pieces)
    ints = np.zeros((NUM_FIELDS, rows), dtype=np.int32)
    seq_rows, last_rows, last_seq = [], [], []
    r = 0
    for i, slot, ids, start, is_last in pieces:
        n = len(ids)
        ints[TOKENS, r:r + n] = ids
        ints[SLOTS, r:r + n] = slot
        ints[POSITIONS, r:r + n] = np.arange(start, start + n)
        seq_rows.append((r, n, slot, start))
        if is_last:
            last_rows.append(r + n - 1)
            last_seq.append(i)
        r += n
    tiles, qt = ops.prefill_tiles(seq_rows)
    with stream:
        ws = Workspace(cfg, ops.storage, rows, max(1, len(last_rows)))
        ws.ints.set(ints)
        tiles_gpu = cp.asarray(tiles)

        def attention(layer, qkv, bias, att):
            q = layers.rope(ws, rows, layer, qkv, bias)
            ops.attention_prefill(q, layers.kv_layers[layer], tiles_gpu, qt, att)

        layers.forward(ws, rows, attention)
        if last_rows:
            h_last = cp.ascontiguousarray(ws.h[cp.asarray(np.asarray(last_rows, dtype=np.int64))])
            ops.gemm(h_last, layers.head, ws.logits[:len(last_rows)])
            logits_out[cp.asarray(np.asarray(last_seq, dtype=np.int64))] = ws.logits[:len(last_rows)]
        stream.synchronize()


def prefill_by_decode(seqs, logits_out: cp.ndarray, decode_logits, stream) -> None:
    """The batch-invariant prefill: token j of every sequence still that long in one decode
    step (`decode_logits(slots, tokens, positions)`, the logits on the GPU), the last
    position's logits of each sequence into its row of `logits_out`."""
    longest = max(len(ids) for _, ids, _ in seqs)
    for j in range(longest):
        rows = [i for i, (_, ids, _) in enumerate(seqs) if j < len(ids)]
        logits = decode_logits([seqs[i][0] for i in rows], [seqs[i][1][j] for i in rows],
                               [seqs[i][2] + j for i in rows])
        last = [r for r, i in enumerate(rows) if j == len(seqs[i][1]) - 1]
        if last:
            with stream:
                where = cp.asarray(np.asarray([rows[r] for r in last], dtype=np.int64))
                logits_out[where] = logits[cp.asarray(np.asarray(last, dtype=np.int64))]
