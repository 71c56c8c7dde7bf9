"""Every engine tensor as a view of one flat fp32 buffer in `flat_offsets`' layout: how the
trainer holds its CUDA masters. It is a read-only mapping {name: view} like any other, so every
engine takes it; the CUDA engine also sees the one buffer behind it and rounds it into its own
flat buffer with one check and one launch, where a mapping of views costs a check per tensor
(~170 at 0.5B: host work the GPU waits for at every sync)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from ratchet.errors import InputError
from ratchet.model.config import ModelConfig
from ratchet.model.layout import flat_offsets, flat_views


class FlatWeights(Mapping):
    """`flat`: a 1-D array (torch or CuPy) of exactly flat_offsets' length, the layout the
    engine's buffers share. The views are made on first use and kept."""

    def __init__(self, cfg: ModelConfig, flat):
        offsets, length = flat_offsets(cfg)
        if len(flat.shape) != 1 or int(flat.shape[0]) != length:
            raise InputError(f"FlatWeights: a flat buffer of shape {tuple(flat.shape)}, expected ({length},): "
                             "flat_offsets' length for this model")
        self.cfg, self.flat = cfg, flat
        self._names = tuple(offsets)  # expected_shapes' order
        self._views: dict | None = None

    @property
    def views(self) -> dict:
        if self._views is None:
            self._views = flat_views(self.cfg, self.flat)
        return self._views

    def __getitem__(self, name: str):
        return self.views[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def on(self, device) -> "FlatWeights":
        """The same weights on `device` (torch): itself when already there, else one copy."""
        flat = self.flat.to(device)
        return self if flat is self.flat else FlatWeights(self.cfg, flat)


def has_no_gaps(cfg: ModelConfig) -> bool:
    """Whether flat_offsets' layout is the packed one (every size a multiple of FLAT_ALIGN, as in
    the Qwen2 models): then a packed flat buffer (rl.sync.flatten's) is a FlatWeights' too."""
    offsets, length = flat_offsets(cfg)
    return length == sum(size for _, size in offsets.values())
