"""dev/tf32x3.py, the lab's three-TF32-product matmul: the split is exact, the three products
recompose the product and its gradients (in the CPU's fp32 sums), the CPU never takes it, and on
a GPU it lands between one TF32 product and cuBLAS's fp32, as the H200 measured."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dev.tf32x3 import _LinearTF32x3, fp32_matmul, linear, mm_tf32x3, set_fp32_matmul, split_tf32


@pytest.fixture
def tf32x3():
    set_fp32_matmul("tf32x3")
    yield
    set_fp32_matmul("ieee")


def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    ref = ref.detach()
    return float((a.detach().double() - ref).norm() / ref.norm())


def test_the_split_is_exact_and_its_high_part_a_tf32_value():
    t = torch.randn(257, 33) * torch.logspace(-20, 20, 33)
    hi, lo = split_tf32(t.t())  # a transposed view, as the backward pass splits its operands
    assert torch.equal(hi + lo, t.t())
    assert int((hi.contiguous().view(torch.int32) & 8191).abs().max()) == 0
    assert float((lo.abs() / t.t().abs()).max()) < 2.0 ** -10


def test_three_products_recompose_the_product():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(96, 300, generator=g), torch.randn(300, 70, generator=g)
    ref = a.double() @ b.double()
    assert rel_err(mm_tf32x3(a, b), ref) < 1e-6
    assert rel_err(mm_tf32x3(a, b.t().contiguous().t()), ref) < 1e-6  # strided operands


def test_the_function_gives_linears_values_and_gradients():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, 40, generator=g, requires_grad=True)
    w = torch.randn(24, 40, generator=g, requires_grad=True)
    b = torch.randn(24, generator=g, requires_grad=True)
    gy = torch.randn(3, 5, 24, generator=g)
    got = _LinearTF32x3.apply(x, w, b)
    got_grads = torch.autograd.grad(got, (x, w, b), gy)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
    want = F.linear(x64, w64, b64)
    want_grads = torch.autograd.grad(want, (x64, w64, b64), gy.double())
    assert got.shape == want.shape and rel_err(got, want) < 1e-6
    for mine, ref in zip(got_grads, want_grads):
        assert mine.shape == ref.shape and rel_err(mine, ref) < 1e-6


def test_the_function_without_bias_or_input_gradient():
    x, w = torch.randn(7, 16), torch.randn(4, 16, requires_grad=True)
    y = _LinearTF32x3.apply(x, w, None)
    (gw,) = torch.autograd.grad(y.sum(), (w,))
    assert torch.allclose(gw, torch.ones(7, 4).t() @ x, rtol=1e-5, atol=1e-5)


def test_the_cpu_keeps_its_own_sums_bit_for_bit(tf32x3):
    x, w = torch.randn(9, 32), torch.randn(8, 32)
    assert torch.equal(linear(x, w), F.linear(x, w))


def test_an_unknown_setting_is_refused_by_name():
    with pytest.raises(ValueError, match="'tf32x2' is not one of"):
        set_fp32_matmul("tf32x2")
    assert fp32_matmul() == "ieee"


@pytest.mark.gpu
def test_on_a_gpu_tf32x3_lies_between_one_tf32_product_and_ieee(tf32x3):
    """At a trainer's shape (K = 896): far better than one TF32 product, yet not ieee's error
    (the tensor cores' accumulation), which is why the ablations keep cuBLAS's fp32."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(2048, 896, device="cuda", generator=g)
    w = torch.randn(4864, 896, device="cuda", generator=g) * 896 ** -0.5
    ref = x.double() @ w.double().t()
    ieee = rel_err(F.linear(x, w), ref)
    mine = rel_err(linear(x, w), ref)
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    try:
        one_tf32 = rel_err(F.linear(x, w), ref)
    finally:
        torch.backends.cuda.matmul.fp32_precision = "ieee"
    assert 10 * mine < one_tf32 and mine > 2 * ieee, (ieee, mine, one_tf32)
