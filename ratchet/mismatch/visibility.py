"""Which updates the engine can see: an fp32 master that moves less than half a unit in the
last place of the engine dtype rounds back to the value the engine already holds."""

from __future__ import annotations

from typing import Mapping

import torch

from ratchet.trainer.precision import TORCH_DTYPES


def _tensor(w) -> torch.Tensor:
    """fp32 torch tensor of `w` (NumPy arrays become CPU tensors; torch ones stay where they are)."""
    return w.float() if isinstance(w, torch.Tensor) else torch.as_tensor(w, dtype=torch.float32)


def _rounded(w: torch.Tensor, dtype: str) -> torch.Tensor:
    """The values `w` takes once stored in `dtype` (torch's casts round to nearest even, as the
    engine's sync does)."""
    return w.to(TORCH_DTYPES[dtype]).float()


def _count(weights: Mapping, test) -> tuple[int, int]:
    """Counted where the weights live (on the GPU for a GPU trainer: 0.5B parameters a few
    times per update would take tens of seconds in NumPy), the tensors' counts summed there
    and read once: a read a tensor waits for the GPU ~300 times a count, and on a GPU shared
    with other jobs each wait is long."""
    hits, total = None, 0
    for name, w in weights.items():
        found = torch.count_nonzero(test(name, _tensor(w)))
        hits = found if hits is None else hits + found
        total += int(w.numel() if isinstance(w, torch.Tensor) else w.size)
    return (0 if hits is None else int(hits)), total


def changed_share(before: Mapping, after: Mapping, dtype: str) -> float:
    """Share of weights whose value in `dtype` differs between the two sets of fp32 masters."""
    hits, total = _count(after, lambda name, w: _rounded(w, dtype) != _rounded(_tensor(before[name]), dtype))
    return hits / total if total else 0.0


def moved_share(before: Mapping, after: Mapping) -> float:
    """Share of fp32 masters that changed at all."""
    hits, total = _count(after, lambda name, w: w != _tensor(before[name]))
    return hits / total if total else 0.0


def off_grid_share(weights: Mapping, dtype: str) -> float:
    """Share of fp32 values that `dtype` cannot hold exactly (rounding changes them)."""
    hits, total = _count(weights, lambda name, w: _rounded(w, dtype) != w)
    return hits / total if total else 0.0


def first_rows(masters: Mapping, dtypes) -> list[dict]:
    """Update 0, the converted weights: nothing moved yet; how far off each grid they lie."""
    return [{"update": 0, "steps": 0, "dtype": d, "moved_share": 0.0, "changed_share": 0.0,
             "off_grid_share": off_grid_share(masters, d)} for d in dtypes]


def update_rows(update: int, steps: int, before: Mapping, after: Mapping, dtypes) -> list[dict]:
    """One row per dtype for one update: the share of masters it moved, the share whose
    `dtype` value it changed, and the share of masters off the `dtype` grid after it."""
    moved = moved_share(before, after)
    return [{"update": update, "steps": steps, "dtype": d, "moved_share": moved,
             "changed_share": changed_share(before, after, d),
             "off_grid_share": off_grid_share(after, d)} for d in dtypes]
