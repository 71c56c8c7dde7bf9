"""The flat layout trainer masters and engine buffers share on CUDA (`flat_offsets`): offsets in
the engine's order, aligned, without gaps at Qwen2 shapes; masters made views of one buffer
train exactly as separate ones; the sync's coalescing of neighbouring ranges (pure pointer
arithmetic, checked here without a GPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_policy import make_cfg, random_batch, random_weights

from ratchet.bench.workload import SHAPES
from ratchet.model.layout import FLAT_ALIGN, coalesce, expected_shapes, flat_offsets
from ratchet.trainer.policy import Policy


def test_offsets_follow_the_engine_order_aligned_and_never_overlap():
    cfg = make_cfg()  # hidden 32: sizes that are not multiples of the alignment
    offsets, length = flat_offsets(cfg)
    assert list(offsets) == list(expected_shapes(cfg))
    ends = 0
    for name, (offset, size) in offsets.items():
        assert offset % FLAT_ALIGN == 0 and offset >= ends and size == int(np.prod(expected_shapes(cfg)[name]))
        ends = offset + size
    assert ends <= length < ends + FLAT_ALIGN


@pytest.mark.parametrize("shape", ["qwen2.5-0.5b", "qwen2.5-coder-1.5b", "qwen2.5-7b"])
def test_qwen_shapes_lie_back_to_back(shape):
    """No padding at the real shapes, so a whole sync is one contiguous range on both sides."""
    cfg = SHAPES[shape]()
    offsets, length = flat_offsets(cfg)
    assert length == sum(size for _, size in offsets.values())


def _train(policy: Policy, steps: int = 3) -> list[float]:
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    losses = []
    for step in range(steps):
        prompts, responses = random_batch(seed=step)
        logp, mask, _ = policy.token_logprobs(prompts, responses)
        loss = -logp[mask].mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_flat_masters_are_views_of_one_buffer_and_train_bit_for_bit_as_separate_ones():
    cfg = make_cfg()
    weights = random_weights(cfg)
    apart, flat = Policy(cfg), Policy(cfg)
    flat.flatten_masters()
    for p in (apart, flat):
        p.load_weights(weights)
    base = flat.embed.weight.untyped_storage().data_ptr()
    offsets, _ = flat_offsets(cfg)
    for name, t in flat.export_weights().items():
        assert t.untyped_storage().data_ptr() == base and t.data_ptr() == base + 4 * offsets[name][0], name
    assert _train(apart) == _train(flat)
    for (name, a), b in zip(apart.export_weights().items(), flat.export_weights().values()):
        assert torch.equal(a, b), name
    # the optimiser wrote into the views, so the flat buffer is still the masters
    assert flat.embed.weight.untyped_storage().data_ptr() == base


def test_from_weights_flattens_on_cuda_only():
    cfg = make_cfg()
    policy = Policy.from_weights(cfg, random_weights(cfg), device="cpu")
    ptrs = {t.untyped_storage().data_ptr() for t in policy.export_weights().values()}
    assert len(ptrs) == len(expected_shapes(cfg))  # host masters stay apart (safetensors saves them)


def test_coalesce_merges_only_ranges_that_continue_each_other_on_both_sides():
    # fp32 sources, 16-bit buffers: tensors of 10, 6 and 4 values back to back on both sides
    assert coalesce([1000, 1040, 1064], [500, 520, 532], [10, 6, 4], 2) == ([1000], [500], [20])
    # the middle buffer elsewhere: nothing merges across it
    assert coalesce([1000, 1040, 1064], [500, 900, 532], [10, 6, 4], 2) == (
        [1000, 1040, 1064], [500, 900, 532], [10, 6, 4])
    # a gap (a tensor not in this sync) on the source side only: no merge
    assert coalesce([1000, 1048], [500, 520], [10, 6], 2) == ([1000, 1048], [500, 520], [10, 6])
    # fp32 buffers (4-byte elements)
    assert coalesce([0, 40], [800, 840], [10, 6], 4) == ([0], [800], [16])


def _gapless_cfg():
    """make_cfg's model at sizes that are multiples of FLAT_ALIGN: the packed layout is the flat one."""
    import dataclasses

    return dataclasses.replace(make_cfg(), vocab_size=128, hidden_size=64, intermediate_size=128,
                               num_heads=4, num_kv_heads=2, head_dim=16)


def test_flat_weights_is_the_mapping_of_its_views_and_names_a_wrong_length():
    from ratchet.errors import InputError
    from ratchet.model.flat_weights import FlatWeights
    from ratchet.model.layout import flat_views

    cfg = make_cfg()
    _, length = flat_offsets(cfg)
    flat = torch.arange(length, dtype=torch.float32)
    weights = FlatWeights(cfg, flat)
    assert list(weights) == list(expected_shapes(cfg)) and len(weights) == len(expected_shapes(cfg))
    for name, view in flat_views(cfg, flat).items():
        assert torch.equal(weights[name], view) and weights[name].data_ptr() == view.data_ptr(), name
    assert weights.on("cpu") is weights  # already there: no copy
    with pytest.raises(InputError, match=rf"shape \({length - 1},\), expected \({length},\)"):
        FlatWeights(cfg, flat[:-1])


def test_policy_flat_weights_while_every_parameter_views_the_buffer():
    """The sync takes the one buffer only while it is the masters: after a parameter is
    reassigned (as .to() to another device does), the mapping again."""
    from ratchet.rl.sync import masters

    cfg = make_cfg()
    policy = Policy(cfg)
    assert policy.flat_weights() is None and not hasattr(masters(policy), "flat")  # not flattened
    policy.flatten_masters()
    policy.load_weights(random_weights(cfg))
    flat = policy.flat_weights()
    assert flat is not None and masters(policy) is flat
    for name, t in policy.export_weights().items():
        assert t.data_ptr() == flat[name].data_ptr() and torch.equal(t, flat[name]), name
    policy.norm.weight.data = policy.norm.weight.data.clone()
    assert policy.flat_weights() is None
    assert not hasattr(masters(policy), "flat")


def test_flatten_and_unflatten_keep_the_packed_layout_and_copy():
    """The split link's wire: FlatWeights without gaps travel as one copy of their buffer, which
    unflattens back to FlatWeights (one launch on a CUDA engine); with gaps, as before."""
    from ratchet.model.flat_weights import FlatWeights, has_no_gaps
    from ratchet.rl.sync import flatten, unflatten

    cfg = _gapless_cfg()
    assert has_no_gaps(cfg) and not has_no_gaps(make_cfg())
    policy = Policy(cfg)
    policy.flatten_masters()
    policy.load_weights(random_weights(cfg))
    flat_masters = policy.flat_weights()
    wire = flatten(flat_masters)
    assert wire.data_ptr() != flat_masters.flat.data_ptr()  # a copy: the optimiser may run on
    assert torch.equal(wire, flatten(dict(flat_masters)))  # as the mapping's packed cat
    back = unflatten(wire, cfg)
    assert isinstance(back, FlatWeights) and back.flat is wire
    gaps = make_cfg()
    packed = flatten(random_weights_torch(gaps))
    assert isinstance(unflatten(packed, gaps), dict)


def test_for_engine_gives_a_host_engine_numpy_views_of_the_same_values():
    from ratchet.model.flat_weights import FlatWeights
    from ratchet.rl.sync import for_engine

    class HostEngine:
        weight_device = "cpu"

    cfg = make_cfg()
    _, length = flat_offsets(cfg)
    weights = FlatWeights(cfg, torch.randn(length))
    out = for_engine(HostEngine(), weights)
    assert list(out) == list(weights)
    for name, value in out.items():
        assert isinstance(value, np.ndarray) and np.array_equal(value, weights[name].numpy()), name


def random_weights_torch(cfg):
    return {k: torch.from_numpy(v) for k, v in random_weights(cfg).items()}
