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


def test_the_time_left_counts_the_measurements_still_ahead():
    """ablate_decompose at 1.5B: updates of ~2 s, a measurement of ~60 s after updates 0, 1, 3,
    10 and 30. After update 5 the time left is 25 updates and two measurements (~2.5 min), where
    a rate of updates alone says 50 s; after update 30 the last measurement is still ahead."""
    from ratchet.progress import MeasuredRunEta

    clock, out = Clock(), io.StringIO()
    eta = MeasuredRunEta(30, (0, 1, 3, 10, 30), clock=clock)
    p = Progress("ablate_decompose", 30, unit="update", every_s=0, stream=out, clock=clock, eta=eta)
    assert eta() is None  # nothing timed yet
    for update in range(31):
        clock.t += 2.0 if update else 1.0
        eta.updated(update)
        line = p.update(update)
        if update in (0, 1, 3, 10, 30):
            clock.t += 60.0
            eta.measured(update)
            p.update(update)  # the measurement's own log: the updates' rate starts after it
        if update == 5:
            assert eta() == 25 * 2.0 + 2 * 60.0
            assert line == "[ablate_decompose] 5/30 updates (17%), 2.0 s/update, ETA 2m50s"
        if update == 30:
            assert line == "[ablate_decompose] 30/30 updates (100%), 2.0 s/update, ETA 1m00s"
    assert eta() == 0.0


def test_a_plain_progress_ignores_no_eta():
    clock, out = Clock(), io.StringIO()
    p = Progress("x", 10, every_s=0, stream=out, clock=clock, eta=lambda: None)
    clock.t = 1.0
    assert p.update(1) == "[x] 1/10 steps (10%), 1.00 steps/s, ETA 9s"

