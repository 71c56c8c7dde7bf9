"""GRPO's loss pieces against hand-derived values and gradients."""

from __future__ import annotations

import pytest
import torch

from ratchet.rl.loss import (clipped_objective, group_advantages, informative_groups, mis_weights,
                             policy_loss, tis_weights)


def _grad(logp, old, adv, mask, weights=None, n=None, eps_low=0.2, eps_high=0.2):
    logp = logp.clone().requires_grad_(True)
    weights = mask.float() if weights is None else weights
    loss, _ = policy_loss(logp, old, adv, mask, weights, n or int(mask.sum()), eps_low, eps_high)
    loss.backward()
    return loss, logp.grad


def test_gradient_at_ratio_one_is_minus_advantage_over_tokens():
    torch.manual_seed(0)
    logp = -torch.rand(3, 5) * 3  # [B, T]
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)
    adv = torch.tensor([1.5, -0.7, 0.3])
    loss, grad = _grad(logp, logp.detach(), adv, mask)
    n = int(mask.sum())
    # d loss / d logp_t = -A / N on every real token, 0 on padding (chain rule: d/dtheta = that * grad log p)
    expected = (-adv[:, None] / n).expand_as(logp) * mask
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-7)
    torch.testing.assert_close(loss, -(adv[:, None] * mask).sum() / n)


def test_gradient_through_a_real_model_is_minus_advantage_times_grad_logp():
    """Chain rule end to end: with old = logp.detach(), grad of the loss equals
    -(1/N) sum_t A_t grad log p_t, computed here separately."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 6)
    x = torch.randn(2, 3, 4)
    tokens = torch.tensor([[1, 2, 3], [4, 5, 0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    adv = torch.tensor([0.8, -1.2])
    logp = torch.log_softmax(lin(x), -1).gather(-1, tokens[..., None])[..., 0]
    loss, _ = policy_loss(logp, logp.detach(), adv, mask, mask.float(), int(mask.sum()))
    got = torch.autograd.grad(loss, lin.weight)[0]
    logp2 = torch.log_softmax(lin(x), -1).gather(-1, tokens[..., None])[..., 0]
    surrogate = -(adv[:, None] * logp2 * mask).sum() / int(mask.sum())
    want = torch.autograd.grad(surrogate, lin.weight)[0]
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("adv,ratio,stopped", [
    (1.0, 1.5, True),    # A > 0, ratio above 1 + eps: clipped, no gradient
    (-1.0, 0.5, True),   # A < 0, ratio below 1 - eps: clipped, no gradient
    (1.0, 0.5, False),   # A > 0, ratio below 1 - eps: the unclipped term is the min, gradient flows
    (-1.0, 1.5, False),  # A < 0, ratio above 1 + eps: gradient flows
    (1.0, 1.1, False),   # inside the band: gradient flows
    (-1.0, 0.9, False),
])
def test_clip_stops_the_gradient_exactly_where_ppo_intends(adv, ratio, stopped):
    old = torch.tensor([[-1.0]])
    logp = old + torch.log(torch.tensor(ratio))
    mask = torch.ones(1, 1, dtype=torch.bool)
    a = torch.tensor([adv])
    loss, grad = _grad(logp, old, a, mask)
    _, clipped = clipped_objective(logp, old, a)
    assert bool(clipped[0, 0]) == stopped
    if stopped:
        assert grad[0, 0] == 0
        torch.testing.assert_close(loss, torch.tensor(-adv * (1.2 if adv > 0 else 0.8)))
    else:  # d(-ratio * A)/d logp = -ratio * A
        torch.testing.assert_close(grad[0, 0], torch.tensor(-ratio * adv))


def test_asymmetric_clip_bounds():
    old = torch.zeros(1, 2)
    logp = torch.log(torch.tensor([[1.25, 1.35]]))
    _, clipped = clipped_objective(logp, old, torch.tensor([1.0]), eps_low=0.2, eps_high=0.28)
    assert clipped.tolist() == [[False, True]]


def test_group_advantages_std_and_dr_grpo():
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]],
                     dtype=torch.float64)
    a_none = group_advantages(r, "none")
    torch.testing.assert_close(a_none, r - r.mean(1, keepdim=True))
    a_std = group_advantages(r, "std")
    std = r.std(1, keepdim=True)  # Bessel-corrected, as TRL and verl
    torch.testing.assert_close(a_std[:2], ((r - r.mean(1, keepdim=True)) / (std + 1e-6))[:2])
    torch.testing.assert_close(a_std[0], torch.tensor([1.5, -0.5, -0.5, -0.5], dtype=torch.float64),
                               rtol=0, atol=1e-5)
    assert torch.all(a_std[2] == 0) and torch.all(a_none[2] == 0)  # a constant group: no signal
    with pytest.raises(ValueError):
        group_advantages(r, "max")


def test_all_equal_groups_are_skipped():
    r = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.5, 0.5, 0.25]])
    assert informative_groups(r).tolist() == [False, False, True, True]


def test_tis_weights_token_and_sequence():
    old = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.3, 0.3, 0.3]]))
    eng = torch.log(torch.tensor([[0.25, 0.4, 0.9], [0.3, 0.1, 0.3]]))
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    w = tis_weights(old, eng, mask, cap=2.5, level="token")
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.5, 1.0], [1.0, 2.5, 0.0]]))  # 3 -> cap 2.5
    ws = tis_weights(old, eng, mask, cap=2.5, level="sequence")
    # row 0: 2 * 0.5 * 1 = 1; row 1: 1 * 3 (the padded token does not count) = 3 -> 2.5
    torch.testing.assert_close(ws, torch.tensor([[1.0, 1.0, 1.0], [2.5, 2.5, 0.0]]))
    old.requires_grad_(True)
    assert not tis_weights(old, eng, mask).requires_grad  # a weight, not a path for gradients


def test_mis_weights_token_and_sequence():
    old = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.3, 0.3, 0.3]]))
    eng = torch.log(torch.tensor([[0.25, 0.4, 0.9], [0.3, 0.1, 0.3]]))
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    w = mis_weights(old, eng, mask, low=0.6, high=2.5, level="token")
    torch.testing.assert_close(w, torch.tensor([[1.0, 0.0, 1.0], [1.0, 0.0, 0.0]]))  # 0.5 < 0.6, 3 > 2.5
    ws = mis_weights(old, eng, mask, low=0.6, high=2.5, level="sequence")
    torch.testing.assert_close(ws, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))  # 1 in, 3 out


def test_correction_weights_enter_the_loss_as_factors():
    logp = torch.tensor([[-1.0, -2.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    weights = torch.tensor([[2.0, 0.0]])
    _, grad = _grad(logp, logp.detach(), torch.tensor([1.0]), mask, weights=weights, n=2)
    torch.testing.assert_close(grad, torch.tensor([[-1.0, 0.0]]))


def test_policy_loss_variants_come_from_the_registry():
    from types import SimpleNamespace

    from ratchet.rl.loss import POLICY_LOSSES, correction_weights
    from ratchet.rl.loss_names import BUILTIN_POLICY_LOSSES

    assert set(POLICY_LOSSES) == {"none", "tis", "mis"} == set(BUILTIN_POLICY_LOSSES)
    old = torch.log(torch.tensor([[0.5, 0.2, 0.9]]))
    eng = torch.log(torch.tensor([[0.25, 0.4, 0.9]]))
    mask = torch.ones(1, 3, dtype=torch.bool)
    knobs = SimpleNamespace(tis_cap=2.5, mis_low=0.6, mis_high=2.5, is_level="token")
    torch.testing.assert_close(correction_weights("tis", old, eng, mask, knobs), tis_weights(old, eng, mask, 2.5))
    torch.testing.assert_close(correction_weights("mis", old, eng, mask, knobs),
                               mis_weights(old, eng, mask, 0.6, 2.5))
    torch.testing.assert_close(correction_weights("none", old, eng, mask, knobs), torch.ones(1, 3))
    with pytest.raises(ValueError):
        correction_weights("ppo-kl", old, eng, mask, knobs)
