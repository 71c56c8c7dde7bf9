"""Progress lines: rate and time left, throttled, the last one always printed."""

from __future__ import annotations

import io

from ratchet.progress import Progress


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_rate_eta_and_throttling():
    clock, out = Clock(), io.StringIO()
    p = Progress("train_colocated", 100, every_s=5, stream=out, clock=clock)
    clock.t = 2.0
    assert p.update(1) == "[train_colocated] 1/100 steps (1%), 2.0 s/step, ETA 3m18s"
    clock.t = 4.0
    assert p.update(2) is None  # 2 s after the last line
    clock.t = 20.0
    assert p.update(10, "reward 0.5") == "[train_colocated] 10/100 steps (10%), 2.0 s/step, ETA 3m00s  reward 0.5"
    clock.t = 21.0
    assert p.update(100).startswith("[train_colocated] 100/100 steps (100%), ")
    assert out.getvalue().count("\n") == 3


def test_the_last_unit_is_printed_once():
    """ablate_decompose reports update 30 from its sources, its visibility and each dtype's
    gradients: one last line, not four."""
    clock, out = Clock(), io.StringIO()
    p = Progress("ablate_decompose", 30, unit="update", every_s=5, stream=out, clock=clock)
    clock.t = 1.0
    assert p.update(30) is not None
    assert [p.update(30), p.update(30)] == [None, None]
    assert out.getvalue().count("\n") == 1


def test_the_rate_is_the_recent_units_own():
    clock, out = Clock(), io.StringIO()
    p = Progress("train_split", 140, every_s=0, window=3, stream=out, clock=clock)
    for step in range(60):  # a resumed run relogs its earlier steps at once, with their durations
        p.update(step + 1, unit_seconds=4.0)
    assert p.update(61, unit_seconds=4.0) == "[train_split] 61/140 steps (44%), 4.0 s/step, ETA 5m16s"
    for step in range(61, 64):
        p.update(step + 1, unit_seconds=0.5)
    assert p.update(65, unit_seconds=0.5).endswith("(46%), 2.00 steps/s, ETA 38s")


def test_a_unit_whose_plural_is_not_an_s_says_so():
    out, t = io.StringIO(), [0.0]
    p = Progress("score", 10, unit="batch", units="batches", every_s=0, window=1, stream=out,
                 clock=lambda: t[0])
    t[0] = 0.5
    assert p.update(1).startswith("[score] 1/10 batches (10%), 2.00 batches/s")
    t[0] = 3.5
    assert ", 3.0 s/batch" in p.update(2)
