"""A lab experiment (issue 18, goal 5), not part of the product: the trainer's fp32 products as
three TF32 products on the tensor cores ("tf32x3") instead of cuBLAS's fp32 units ("ieee"). An
operand a is split into hi (a with its 13 low mantissa bits cleared: a TF32 value, exact on the
tensor cores) and lo = a - hi (exact in fp32), and a b = a_hi b_hi + a_hi b_lo + a_lo b_hi.

Measured on an H200 (`python3 -m dev.gpu.tf32x3_bench`, docs/KERNELS.md): only ~1.4x faster
than ieee over the trainer's products, and not of fp32's class: the tensor cores accumulate
each product in reduced precision, so the error grows with the reduction length (4-70x ieee's,
worst at the LM head's input gradient). It was taken out of the ablations (`ablate.fp32_matmul`),
whose fp32 reference must be fp32's; kept here with its probe and tests.

A process's setting, as torch.backends' own matmul flags are; only fp32 CUDA products outside
autocast take it, the CPU keeps its own fp32 sums."""

from __future__ import annotations

import torch
import torch.nn.functional as F

FP32_MATMULS = ("ieee", "tf32x3")
_setting = ["ieee"]


def set_fp32_matmul(name: str) -> None:
    if name not in FP32_MATMULS:
        raise ValueError(f"fp32_matmul {name!r} is not one of {FP32_MATMULS}")
    _setting[0] = name


def fp32_matmul() -> str:
    return _setting[0]


def split_tf32(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(hi, lo): hi is t with its 13 low mantissa bits cleared (a TF32 value), lo = t - hi exactly."""
    hi = (t.view(torch.int32) & -8192).view(torch.float32)
    return hi, t - hi


def _products(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """a @ b from split operands (hi, lo): three TF32 products, the small terms first."""
    (a_hi, a_lo), (b_hi, b_lo) = a, b
    before = torch.backends.cuda.matmul.fp32_precision
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    try:
        out = a_hi @ b_lo
        out.addmm_(a_lo, b_hi)
        return out.addmm_(a_hi, b_hi)
    finally:
        torch.backends.cuda.matmul.fp32_precision = before


def mm_tf32x3(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b (2-D fp32) as three TF32 products."""
    return _products(split_tf32(a), split_tf32(b))


def _transposed(pair: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    return pair[0].t(), pair[1].t()


class _LinearTF32x3(torch.autograd.Function):
    """y = x w^T + b with the forward and both backward products in three TF32 products each;
    the backward splits the incoming gradient once for both (at the LM head it is [n, vocab])."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        y = mm_tf32x3(x.reshape(-1, x.shape[-1]), weight.t())
        if bias is not None:
            y += bias
        return y.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        g = split_tf32(grad.reshape(-1, grad.shape[-1]))
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = _products(g, split_tf32(weight)).view(x.shape)
        if ctx.needs_input_grad[1]:
            gw = _products(_transposed(g), split_tf32(x.reshape(-1, x.shape[-1])))
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = grad.reshape(-1, grad.shape[-1]).sum(0)
        return gx, gw, gb


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, in tf32x3 where the process says so and the product is an fp32 one on CUDA."""
    if (_setting[0] == "tf32x3" and x.is_cuda and x.dtype == weight.dtype == torch.float32
            and not torch.is_autocast_enabled("cuda")):
        return _LinearTF32x3.apply(x, weight, bias)
    return F.linear(x, weight, bias)

