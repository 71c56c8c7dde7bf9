"""The PyTorch policy in the engine layout (`state_dict()` keys are the engine names, `wqkv`
and `w_gate_up` fused), so a weight sync is a copy. `token_logprobs` runs the LM head only on
the positions that predict response tokens, in chunks, so the [B, T, V] logits never exist."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call
from torch.utils.checkpoint import checkpoint

from ratchet.model.config import ModelConfig
from ratchet.model.flat_weights import FlatWeights
from ratchet.model.layout import check_weights, expected_shapes, flat_offsets, rope_tables
from ratchet.trainer.dynamo_import import import_dynamo
from ratchet.trainer.precision import autocast, rounded_parameters


ATTENTION = ("mask", "causal")  # train.attention


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """weight * x / rms(x), normalised in fp32 whatever the activations' dtype (as HF).
        F.rms_norm is one fused kernel forward and one backward on CUDA, where the trainer's
        step is bound by its launches; on the CPU it is the sum of its parts, bit for bit."""
        if x.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        return self.weight * F.rms_norm(x.float(), self.weight.shape, eps=self.eps).to(x.dtype)


def flat_masters(cfg: ModelConfig, device) -> FlatWeights:
    """Uninitialised fp32 tensors under the engine names, each a view of one flat buffer in
    `flat_offsets`' layout: how the trainer holds its CUDA masters."""
    _, length = flat_offsets(cfg)
    return FlatWeights(cfg, torch.empty(length, dtype=torch.float32, device=device))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Block(nn.Module):
    """One decoder layer; its attributes are the engine's per-layer names."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, hd = cfg.hidden_size, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, hd
        self.attn_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.wqkv = nn.Linear(d, cfg.qkv_size, bias=cfg.qkv_bias)
        self.wo = nn.Linear(cfg.num_heads * hd, d, bias=False)
        self.mlp_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.w_gate_up = nn.Linear(d, 2 * cfg.intermediate_size, bias=False)
        self.w_down = nn.Linear(cfg.intermediate_size, d, bias=False)

    def forward(self, x, cos, sin, mask):
        x = x + self.attention(self.attn_norm(x), cos, sin, mask)
        gate, up = self.w_gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.w_down(F.silu(gate) * up)

    def attention(self, h, cos, sin, mask):
        b, t, _ = h.shape
        hd = self.head_dim
        q, k, v = self.wqkv(h).split([self.num_heads * hd, self.num_kv_heads * hd,
                                      self.num_kv_heads * hd], dim=-1)
        q = q.view(b, t, self.num_heads, hd).transpose(1, 2)  # [B, H, T, hd]
        k = k.view(b, t, self.num_kv_heads, hd).transpose(1, 2)  # [B, K, T, hd]
        v = v.view(b, t, self.num_kv_heads, hd).transpose(1, 2)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                           enable_gqa=self.num_heads != self.num_kv_heads)
        return self.wo(o.transpose(1, 2).reshape(b, t, self.num_heads * hd))


def _recomputed(layer: nn.Module, x, cos, sin, mask):
    """checkpoint() of one layer on the weights it holds now. Under functional_call (the fix's
    rounded weights) those are swapped in for the forward only: the backward's recompute would
    find the fp32 masters, so the weights go in as inputs and are swapped in again there."""
    names, weights = zip(*layer.named_parameters())

    def run(x, *weights):
        return functional_call(layer, dict(zip(names, weights)), (x, cos, sin, mask))

    return checkpoint(run, x, *weights, use_reentrant=False)


@dataclass
class PackedBatch:
    """prompt + response per row, right-padded, and where the response tokens are."""
    input_ids: torch.Tensor  # [B, T]
    attention_mask: torch.Tensor  # [B, T] bool
    rows: torch.Tensor  # [N] row of each response token
    positions: torch.Tensor  # [N] position whose hidden state predicts it
    targets: torch.Tensor  # [N] the response token
    response_index: torch.Tensor  # [N] its index within the response
    response_mask: torch.Tensor  # [B, Rmax] bool


def to_device(t: torch.Tensor, device) -> torch.Tensor:
    """A host tensor on `device`. To a GPU through pinned memory, without waiting: a plain
    upload from pageable memory waits for every kernel already queued (the last micro-batch's
    backward), so the host could not prepare the next pass while the GPU runs this one. The
    caching host allocator keeps the pinned block until the copy is done."""
    device = torch.device(device)
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def pack(prompts: list[list[int]], responses: list[list[int]], device) -> PackedBatch:
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
    seqs = [list(p) + list(r) for p, r in zip(prompts, responses)]
    t_max = max(len(s) for s in seqs)
    r_max = max(len(r) for r in responses)
    ids = torch.zeros(len(seqs), t_max, dtype=torch.long)
    attention = torch.zeros(len(seqs), t_max, dtype=torch.bool)
    rows, positions, targets, index = [], [], [], []
    for b, (prompt, response) in enumerate(zip(prompts, responses)):
        if not prompt and response:
            raise ValueError(f"row {b}: empty prompt, so no position predicts the first response token")
        ids[b, :len(seqs[b])] = torch.tensor(seqs[b], dtype=torch.long)
        attention[b, :len(seqs[b])] = True
        n = len(response)
        rows += [b] * n
        positions += range(len(prompt) - 1, len(prompt) - 1 + n)
        targets += response
        index += range(n)
    as_long = lambda xs: to_device(torch.tensor(xs, dtype=torch.long), device)  # noqa: E731
    response_mask = torch.arange(r_max)[None, :] < torch.tensor([len(r) for r in responses])[:, None]
    return PackedBatch(to_device(ids, device), to_device(attention, device), as_long(rows), as_long(positions),
                       as_long(targets), as_long(index), to_device(response_mask, device))


def head_chunk(h: torch.Tensor, head_weight: torch.Tensor, targets: torch.Tensor,
               temperature: float, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(target) and entropy for one chunk of hidden states [n, D]. Each step over the
    [n, V] logits is a pass over memory, so none is made that changes nothing: no division at
    temperature 1 (x / 1 is x, its gradient too), and the entropy, a metric no gradient flows
    through, outside autograd: it saves nothing for the backward pass, so the checkpoint's
    recompute stops before it. The same values and gradients, bit for bit."""
    logits = F.linear(h, head_weight).float()  # [n, V]
    if temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    chosen = logp.gather(-1, targets[:, None]).squeeze(-1)
    if not with_entropy:
        return chosen, chosen.new_zeros(0)
    with torch.no_grad():
        return chosen, -(logp.exp() * logp).sum(-1)


class Policy(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None
        self._flat: tuple[FlatWeights, list] | None = None  # flatten_masters' buffer, each parameter's pointer

    # ------------------------------------------------------------------ weights
    @classmethod
    def from_weights(cls, cfg: ModelConfig, weights: dict, device="cpu") -> "Policy":
        import_dynamo()  # before the modules' init would import it with this call's frames
        # Built on the meta device: a random init of 0.5B parameters would cost seconds for nothing.
        with torch.device("meta"):
            policy = cls(cfg)
        policy.to_empty(device=device)
        if torch.device(device).type == "cuda":
            policy.flatten_masters()
        policy.load_weights(weights)
        return policy

    def flatten_masters(self) -> None:
        """Every parameter a view of one flat fp32 buffer laid out as the engine's buffers are
        (`flat_offsets`), so the sync converts one contiguous range. On CUDA only: on the host
        nothing syncs through it, and safetensors refuses to save views of one storage."""
        params = dict(self.named_parameters())
        flat = flat_masters(self.cfg, params["embed.weight"].device)
        for name, view in flat.items():
            params[name].data = view
        self._flat = (flat, [(p, p.data_ptr()) for p in params.values()])

    def flat_weights(self) -> FlatWeights | None:
        """The masters as the one buffer they view (flatten_masters, CUDA), for a sync in one
        check and one launch; None when not flattened or when a parameter no longer views it
        (moved by .to(), or reassigned): then `export_weights`' mapping is the way."""
        if self._flat is None:
            return None
        flat, pointers = self._flat
        return flat if all(p.data_ptr() == ptr for p, ptr in pointers) else None

    def load_weights(self, weights: dict) -> None:
        check_weights(self.cfg, weights, "Policy.load_weights")
        params = dict(self.named_parameters())
        with torch.no_grad():
            for name, value in weights.items():
                if isinstance(value, np.ndarray):  # copy only if read-only (a memmap) or not fp32
                    value = torch.from_numpy(np.require(value, np.float32, ["C", "W"]))
                params[name].copy_(value)

    def export_weights(self) -> dict[str, torch.Tensor]:
        """The fp32 masters under the engine names, detached. They alias the live parameters:
        copy them before the next optimiser step if they must outlive it."""
        params = dict(self.named_parameters())
        return {name: params[name].detach() for name in expected_shapes(self.cfg)}

    def head_weight(self) -> torch.Tensor:
        return self.embed.weight if self.cfg.tie_word_embeddings else self.lm_head.weight

    # ------------------------------------------------------------------ trunk
    def rope(self, length: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, head_dim] from the float64 tables the engine also uses."""
        if self._rope is None or self._rope[0].shape[0] < length or self._rope[0].device != device:
            cos, sin = rope_tables(self.cfg, max(length, 256))
            cos, sin = (torch.from_numpy(np.concatenate([a, a], axis=-1)).to(device) for a in (cos, sin))
            self._rope = (cos, sin)
        return self._rope[0][:length], self._rope[1][:length]

    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                      attention: str = "mask", gradient_checkpointing: bool = False) -> torch.Tensor:
        """Final-normed hidden states [B, T, D]; right padding, positions from 0 in every row.

        `attention` "mask": an explicit [B, T, T] mask (PyTorch then takes its math or
        memory-efficient kernel); "causal": is_causal alone, which with right padding gives
        every real token the same keys (the pads come after it), and lets PyTorch take a
        fused kernel; the pads' own hidden states differ, and nothing reads them.

        `gradient_checkpointing` (with grad enabled): each layer keeps only its input for the
        backward, which recomputes the layer with the same kernels on the same input, so the
        gradients' bits are those of a plain backward (tests/test_policy.py)."""
        if attention not in ATTENTION:
            raise ValueError(f"attention {attention!r} is not one of {ATTENTION}")
        cos, sin = self.rope(input_ids.shape[1], input_ids.device)
        mask = None if attention == "causal" else self.attention_mask(input_ids, attention_mask)[:, None]
        x = self.embed(input_ids)
        recompute = gradient_checkpointing and torch.is_grad_enabled()
        for layer in self.layers:
            x = _recomputed(layer, x, cos, sin, mask) if recompute else layer(x, cos, sin, mask)
        return self.norm(x)

    @staticmethod
    def attention_mask(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """[B, T, T] bool: causal within each row's real tokens."""
        b, t = input_ids.shape
        if attention_mask is None:
            attention_mask = torch.ones(b, t, dtype=torch.bool, device=input_ids.device)
        causal = torch.tril(torch.ones(t, t, dtype=torch.bool, device=input_ids.device))
        # A pad query still sees itself, so no row of the mask is empty (which would give NaN).
        diagonal = torch.eye(t, dtype=torch.bool, device=input_ids.device)
        return (causal & attention_mask.bool()[:, None, :]) | diagonal

    # ------------------------------------------------------------------ RL
    def token_logprobs(self, prompts: list[list[int]], responses: list[list[int]],
                       temperature: float = 1.0, weight_dtype: str = "fp32",
                       compute_dtype: str = "fp32", chunk_size: int = 2048,
                       with_entropy: bool = False, attention: str = "mask",
                       gradient_checkpointing: bool = False):
        """(logprobs [B, Rmax] fp32, mask [B, Rmax] bool, entropy [B, Rmax] or None).

        log_softmax(logits / temperature) at each response token; temperature 0 (greedy) scores
        at T=1, as the engine does. Zeros where the mask is False.
        """
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        temperature = temperature or 1.0
        device = self.embed.weight.device
        batch = pack(prompts, responses, device)
        args = (batch, temperature, chunk_size, with_entropy, attention, gradient_checkpointing)
        with autocast(device.type, compute_dtype):
            if weight_dtype == "fp32":
                chosen, entropy = self(*args)
            else:
                chosen, entropy = functional_call(self, rounded_parameters(self, weight_dtype), args)
        shape, where = batch.response_mask.shape, (batch.rows, batch.response_index)
        logprobs = torch.zeros(shape, device=device).index_put(where, chosen)
        if with_entropy:
            entropy = torch.zeros(shape, device=device).index_put(where, entropy)
        return logprobs, batch.response_mask, entropy if with_entropy else None

    def forward(self, batch: PackedBatch, temperature: float, chunk_size: int, with_entropy: bool,
                attention: str = "mask", gradient_checkpointing: bool = False):
        """The body of `token_logprobs`, as `forward` so `functional_call` can swap the weights."""
        h = self.hidden_states(batch.input_ids, batch.attention_mask, attention,
                               gradient_checkpointing)[batch.rows, batch.positions]  # [N, D]
        head = self.head_weight()
        chosen, entropy = [h.new_zeros(0, dtype=torch.float32)], [h.new_zeros(0, dtype=torch.float32)]
        for start in range(0, h.shape[0], chunk_size):
            part = (h[start:start + chunk_size], head, batch.targets[start:start + chunk_size],
                    temperature, with_entropy)
            if torch.is_grad_enabled():  # keep one chunk's [n, V] logits alive, not all of them
                c, e = checkpoint(head_chunk, *part, use_reentrant=False)
            else:
                c, e = head_chunk(*part)
            chosen.append(c)
            entropy.append(e)
        return torch.cat(chosen), torch.cat(entropy)
