"""Progress of a long stage where the user is watching: one line every few seconds, with the
rate and the time left. In the pipeline the console is the terminal Snakemake runs in (the
rule hands the stage its stderr as fd 3, `--progress-fd 3`), while the log gets everything."""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO

_console: TextIO = sys.stderr


def set_console_fd(fd: int) -> None:
    """Send progress lines to the open file descriptor `fd` (line-buffered)."""
    global _console
    _console = os.fdopen(fd, "w", buffering=1, closefd=False)


def console() -> TextIO:
    return _console


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


class Progress:
    """`update(done)` after each unit of work; prints `[label] k/N units (p%), rate, ETA` at most
    every `every_s` seconds, and at the last unit once (several measurements may report it).
    The rate is that of the last `window` units (their own durations when given: a resumed run
    replays its earlier steps' rows at once); the time left is `eta()`'s where it gives one
    (MeasuredRunEta), else the rate's."""

    def __init__(self, label: str, total: int, unit: str = "step", every_s: float = 5.0,
                 window: int = 10, stream: TextIO | None = None, clock=time.monotonic,
                 units: str | None = None, eta=None):
        self.label, self.total, self.unit, self.every_s = label, total, unit, every_s
        self.eta = eta  # a callable giving the seconds left (or None), where units alone misjudge it
        self.units = units or unit + "s"  # the plural, where "s" is not it (batch, batches)
        self.stream, self.clock, self.window = stream, clock, window
        self.durations: list[float] = []
        self.last_done, self.last_time = 0, clock()
        self.printed: float | None = None
        self.printed_done: int | None = None

    def update(self, done: int, note: str = "", unit_seconds: float | None = None) -> str | None:
        """The line printed, or None when it is too soon for another."""
        now = self.clock()
        if unit_seconds is not None:
            self.durations.append(unit_seconds)
        elif done > self.last_done:
            self.durations += [(now - self.last_time) / (done - self.last_done)] * (done - self.last_done)
        self.durations = self.durations[-self.window:]
        self.last_done, self.last_time = done, now
        if done < self.total and self.printed is not None and now - self.printed < self.every_s:
            return None
        if done >= self.total and self.printed_done == done:
            return None
        self.printed, self.printed_done = now, done
        line = f"[{self.label}] {done}/{self.total} {self.units} ({100 * done / max(self.total, 1):.0f}%)"
        per_unit = sum(self.durations) / len(self.durations) if self.durations else 0.0
        left = self.eta() if self.eta is not None else None
        if per_unit > 0:
            line += f", {1 / per_unit:.2f} {self.units}/s" if per_unit <= 1 else f", {per_unit:.1f} s/{self.unit}"
            if left is None and done < self.total:
                left = (self.total - done) * per_unit
        if left is not None and round(left) > 0:  # "ETA 0s" says nothing
            line += f", ETA {_duration(left)}"
        if note:
            line += f"  {note}"
        print(line, file=self.stream or console(), flush=True)
        return line


class MeasuredRunEta:
    """The time left of a run of `updates` updates with measurements after some of them
    (`points`), each far longer than an update (ablate_decompose at 1.5B: 30 updates of ~2 s,
    five measurements of ~60 s): each kind's pace is measured apart, since a rate of updates
    alone promised 1.5 minutes of a 7-minute run. Call `updated(u)` when update u is done and
    `measured(u)` when every measurement after it is; `__call__` gives the seconds left, or
    None until each kind has been timed once."""

    def __init__(self, updates: int, points, clock=time.monotonic):
        self.updates, self.points, self.clock = updates, len(set(points)), clock
        self.update_s: list[float] = []
        self.measure_s: list[float] = []
        self.last, self.done_updates = clock(), 0

    def updated(self, update: int) -> None:
        now = self.clock()
        if update > self.done_updates:  # update 0 is the start: nothing to time
            self.update_s.append((now - self.last) / (update - self.done_updates))
        self.last, self.done_updates = now, update

    def measured(self, update: int) -> None:
        now = self.clock()
        self.measure_s.append(now - self.last)
        self.last = now

    def __call__(self) -> float | None:
        if not self.update_s or not self.measure_s:
            return None
        per_update = sum(self.update_s) / len(self.update_s)
        per_point = sum(self.measure_s) / len(self.measure_s)
        return (self.updates - self.done_updates) * per_update + (self.points - len(self.measure_s)) * per_point
