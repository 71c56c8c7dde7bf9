"""The layer loop on the GPU: the model's forward over a workspace's rows, shared by the
packed prefill and the decode step, whose body (inputs in from pinned memory, the layers,
the head, the sampler, outputs out) is what a CUDA graph captures."""

from __future__ import annotations

import cupy as cp
import numpy as np

from ratchet.engine.cuda import sampler as gpu_sampler
from ratchet.engine.cuda.ops import Ops
from ratchet.engine.cuda.plan import SPLIT_K, SPLIT_K_MAX_ROWS, split_k
from ratchet.engine.cuda.staging import (
    FEED,
    NUM_FIELDS,
    PARAMS,
    POSITIONS,
    SEQ_LENS,
    SLOTS,
    TOKENS,
)
from ratchet.model.config import ModelConfig


class Workspace:
    """Activation buffers for up to `rows` rows (views of the first b rows are contiguous)."""

    def __init__(self, cfg: ModelConfig, storage, rows: int, head_rows: int, nsplit: int = 0):
        d, hd = cfg.hidden_size, cfg.head_dim
        group = cfg.num_heads // cfg.num_kv_heads
        self.ints = cp.zeros((NUM_FIELDS, rows), dtype=np.int32)
        self.x = cp.empty((rows, d), dtype=storage)  # residual stream
        self.h = cp.empty((rows, d), dtype=storage)  # norm output
        self.qkv = cp.empty((rows, cfg.qkv_size), dtype=np.float32)
        self.q = cp.empty((rows, cfg.num_heads * hd), dtype=storage)
        self.att = cp.empty((rows, cfg.num_heads * hd), dtype=storage)
        self.proj = cp.empty((rows, d), dtype=storage)  # wo and w_down outputs
        self.gu = cp.empty((rows, 2 * cfg.intermediate_size), dtype=storage)
        self.act = cp.empty((rows, cfg.intermediate_size), dtype=storage)
        self.logits = cp.empty((head_rows, cfg.vocab_size), dtype=np.float32)
        if nsplit:
            self.part_acc = cp.empty((rows, cfg.num_kv_heads, nsplit, group, hd), dtype=np.float32)
            self.part_ml = cp.empty((rows, cfg.num_kv_heads, nsplit, group, 2), dtype=np.float32)
            self.sample_work = gpu_sampler.workspace(rows)
            # split-K slices of wo / w_down (flat: a bucket's [S, b, d] view is contiguous)
            self.parts = cp.empty(SPLIT_K * min(rows, SPLIT_K_MAX_ROWS) * d, dtype=np.float32)
        self.out = cp.zeros((2, rows), dtype=np.int32)  # sampled tokens, logprobs (float32 bits)


class LayerLoop:
    """The model over the KV cache (one array a layer) with RoPE tables; `bind` gives it the
    weight buffers (bound once: later syncs write into the same buffers)."""

    def __init__(self, cfg: ModelConfig, ops: Ops, kv_layers: list, rope_cos: cp.ndarray, rope_sin: cp.ndarray):
        self.cfg, self.ops = cfg, ops
        self.kv_layers, self.rope_cos, self.rope_sin = kv_layers, rope_cos, rope_sin
        self.weights: dict[str, cp.ndarray] = {}

    def bind(self, weights: dict[str, cp.ndarray]) -> None:
        w, cfg = weights, self.cfg
        self.weights = weights
        self.layer_weights = []
        for i in range(cfg.num_layers):
            p = f"layers.{i}."
            nxt = w[f"layers.{i + 1}.attn_norm.weight"] if i + 1 < cfg.num_layers else w["norm.weight"]
            self.layer_weights.append((w[p + "wqkv.weight"], w.get(p + "wqkv.bias"), w[p + "wo.weight"],
                                       w[p + "mlp_norm.weight"], w[p + "w_gate_up.weight"],
                                       w[p + "w_down.weight"], nxt))
        self.head = w.get("lm_head.weight", w["embed.weight"])

    def forward(self, ws: Workspace, rows: int, attention, split: tuple[str, ...] = (),
                feed: bool = False) -> None:
        """Rows' hidden states through every layer; leaves the final norm's output in ws.h.
        split: of "wo", "w_down", those run as split-K products (plan.split_k) whose slices
        the next add_rmsnorm sums (decode buckets). feed: rows may take their token from the
        previous step's sampled tokens (ws.out[0]; decode)."""
        o, eps, cfg = self.ops, self.cfg.rms_norm_eps, self.cfg
        tokens = ws.ints[TOKENS, :rows]
        x, h, qkv, att = ws.x[:rows], ws.h[:rows], ws.qkv[:rows], ws.att[:rows]
        proj, gu, act = ws.proj[:rows], ws.gu[:rows], ws.act[:rows]

        def project_add_norm(name, inp, w, norm_weight):  # x += inp @ w^T (rounded); h = norm(x)
            s = split_k(rows, inp.shape[1]) if name in split else 0
            if s:
                parts = ws.parts[:s * rows * cfg.hidden_size].reshape(s, rows, cfg.hidden_size)
                o.gemm_split(inp, w, parts)
                o.add_rmsnorm(x, None, norm_weight, h, eps, parts=parts)
            else:
                o.gemm(inp, w, proj)
                o.add_rmsnorm(x, proj, norm_weight, h, eps)

        o.embedding(tokens, self.weights["embed.weight"], x,
                    *((ws.ints[FEED, :rows], ws.out[0]) if feed else ()))
        o.add_rmsnorm(x, None, self.weights["layers.0.attn_norm.weight"], h, eps)
        for layer, (wqkv, bias, wo, mlp_norm, w_gate_up, w_down, next_norm) in enumerate(self.layer_weights):
            o.gemm(h, wqkv, qkv)
            attention(layer, qkv, bias, att)  # RoPE (k, v into the cache) and attention
            project_add_norm("wo", att, wo, mlp_norm)
            o.gemm(h, w_gate_up, gu)
            o.swiglu(gu, act)
            project_add_norm("w_down", act, w_down, next_norm)

    def rope(self, ws: Workspace, rows: int, layer: int, qkv: cp.ndarray, bias) -> cp.ndarray:
        """rope_qkv: the rows' queries (returned) and this layer's new k, v into the cache."""
        q = ws.q[:rows]
        self.ops.rope_qkv(qkv, bias, self.rope_cos, self.rope_sin, ws.ints[POSITIONS, :rows], ws.ints[SLOTS, :rows],
                          q, self.kv_layers[layer], self.cfg.num_heads, self.cfg.num_kv_heads)
        return q

    def decode_body(self, ws: Workspace, b: int, sample: bool, host_ints: int, host_out: int, width: int,
                    split: tuple[str, ...], gumbel: cp.ndarray) -> None:
        """Bucket b's decode step: inputs in from pinned memory at device address `host_ints`
        (`width` columns a field), the model, the head, and with `sample` the sampler, its
        tokens and log-probabilities out to `host_out`."""
        self.ops.copy_rows(host_ints, width, ws.ints, width, NUM_FIELDS, b)
        slots, seq_lens = ws.ints[SLOTS, :b], ws.ints[SEQ_LENS, :b]
        part_acc, part_ml = ws.part_acc[:b], ws.part_ml[:b]

        def attention(layer, qkv, bias, att):
            cache = self.kv_layers[layer]
            if self.ops.fused_rope_decode:  # one kernel: RoPE, the cache write and the attention
                self.ops.attention_decode_rope(qkv, bias, self.rope_cos, self.rope_sin, cache, slots, seq_lens,
                                               part_acc, part_ml, att)
            else:
                self.ops.attention_decode(self.rope(ws, b, layer, qkv, bias), cache, slots, seq_lens, part_acc,
                                          part_ml, att)

        self.forward(ws, b, attention, split=split, feed=True)
        self.ops.gemm(ws.h[:b], self.head, ws.logits[:b])
        if sample:  # every row of the bucket: padding rows draw harmless greedy tokens
            gpu_sampler.launch(ws.logits[:b], ws.ints[PARAMS:PARAMS + 5], ws.out[0], ws.out[1].view(np.float32),
                               gumbel, ws.sample_work)
            self.ops.copy_rows(ws.out, width, host_out, width, 2, b)
