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
    assert p.update(100).startswith("[train_colocated] 100/100 steps (100%), 4.76 steps/s")
    assert out.getvalue().count("\n") == 3


def test_a_resumed_run_counts_its_rate_from_the_resume():
    clock, out = Clock(), io.StringIO()
    p = Progress("train_split", 140, start=60, stream=out, clock=clock)
    clock.t = 10.0
    assert p.update(70) == "[train_split] 70/140 steps (50%), 1.00 steps/s, ETA 1m10s"
