"""The measuring engines of one ablation run, each made when first wanted and, where GPU memory
is what limits the run, dropped while the trainer's gradient passes and the GRPO steps between
them run, which sample from none of them: at 1.5B ablate_decompose would otherwise hold up to
three batch-invariant engines of ~5 GiB beside the trainer. Every use syncs an engine from the
masters first, so one made again is the one dropped: the converted weights, the same rows,
buckets and dtype."""

from __future__ import annotations

from typing import Callable, Hashable, Iterable


class MeasuringEngines:
    """key -> engine, made by the `make` it is given on first use and again after `release`."""

    def __init__(self, make: Callable[[Hashable], object], keys: Iterable[Hashable] = ()):
        self._make = make
        self._held: dict = dict.fromkeys(keys)  # None: not made yet, or released

    def add(self, key: Hashable) -> None:
        self._held.setdefault(key, None)

    def keys(self) -> list:
        return list(self._held)

    def __getitem__(self, key: Hashable):
        if self._held[key] is None:
            self._held[key] = self._make(key)
        return self._held[key]

    def released(self) -> bool:
        """Whether some engine is to be made (again) before all are held."""
        return None in self._held.values()

    def make(self, key: Hashable) -> None:
        """Made now where released (or not yet made), and held: no name outside keeps it."""
        self[key]

    def make_all(self) -> None:
        for key in self._held:
            self.make(key)

    def release(self, keep: Iterable[Hashable] = ()) -> None:
        """Drop every engine but those of `keep`; made again on their next use."""
        keep = set(keep)
        for key in self._held:
            if key not in keep:
                self._held[key] = None
