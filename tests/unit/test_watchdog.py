"""The liveness watchdog's decisions (cupyglm.distributed.watchdog), on a fake clock and without MPI."""
from __future__ import annotations

import pytest

from cupyglm.distributed import watchdog as wdm


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _watchdog(clock: Clock, ranks: int = 1) -> wdm.Watchdog:
    link = wdm.Link(None)
    wd = wdm.Watchdog(link, 2.0, on_fire=lambda r: None, abort=lambda c: None, clock=clock, start=False)
    wd.heard = {r: clock() for r in range(1, ranks)}
    wd.done_step = {r: -1 for r in range(1, ranks)}
    return wd


def test_deadline_formula_has_a_floor_and_scales_with_rows():
    assert wdm.step_deadline(30.0, 0, first=False) == 30.0
    assert wdm.step_deadline(30.0, 256, first=False) == 60.0
    assert wdm.step_deadline(30.0, 0, first=True) == 300.0
    assert wdm.step_deadline(30.0, -5, first=False) == 30.0


def test_a_silent_rank_is_named_after_the_timeout():
    clock = Clock()
    wd = _watchdog(clock, ranks=3)
    clock.t += 1.9
    assert wd.check() is None
    wd.heard[2] = clock()                     # rank 2 beats, rank 1 does not
    wd.done_step[1] = 41
    clock.t += 0.2
    reason = wd.check()
    assert reason is not None and reason.startswith("rank 1 has not answered") and "step 41" in reason
    wd.byes.add(1)                            # a rank that confirmed the stop is not silent
    assert wd.check() is None
    assert wd.silent_ranks(1.0) == []


@pytest.mark.parametrize("done, who", [(6, "rank 0"), (5, "rank 1")])
def test_a_step_past_its_deadline_names_the_ranks_behind(done, who):
    clock = Clock()
    wd = _watchdog(clock, ranks=2)
    wd.step_started(1, 10)                    # the first step: 10x, 2 * (1 + 10/256) * 10 = 20.8 s
    clock.t += 20
    wd.heard[1] = clock()
    assert wd.check() is None
    wd.step_done()
    wd.step_started(6, 256)                   # deadline 2 * (1 + 1) = 4 s
    wd.done_step[1] = done
    clock.t += 3.9
    wd.heard[1] = clock()
    assert wd.check() is None
    clock.t += 0.2
    wd.heard[1] = clock()
    reason = wd.check()
    assert reason == f"step 6 ran past its deadline of 4.0 s; not finished on {who}"
    wd.step_done()
    assert wd.check() is None


def test_fire_reports_then_aborts(monkeypatch):
    monkeypatch.setattr(wdm, "FIRE_GRACE_S", 0.0)
    seen: list = []
    wd = wdm.Watchdog(wdm.Link(None), 2.0, on_fire=seen.append, abort=lambda c: seen.append(("abort", c)),
                      start=False)
    wd.fire("rank 1 is gone")
    assert seen == ["rank 1 is gone", ("abort", 1)] and wd.fired == "rank 1 is gone"
    assert wd.confirm_stop(0.0) == []


def test_rank_0s_own_pause_is_not_counted_against_the_others():
    clock = Clock()
    wd = _watchdog(clock, ranks=2)
    wd.step_started(7, 0)
    wd.step_done()
    wd.step_started(8, 0)                     # deadline 2 s
    wd.done_step[1] = 7
    clock.t += 0.05
    assert wd.tick() == 0.0
    clock.t += 8.0                            # rank 0 stopped: no poll, no beat received, for 8 s
    assert wd.tick() == pytest.approx(8.0 - wdm.POLL_S)
    assert wd.check() is None                 # neither rank 1's silence nor step 8's age counts the pause
    assert wd.silent_ranks(1.0) == []
    clock.t += 2.1                            # awake time past the timeout: rank 1 is judged again
    reason = wd.check()
    assert reason is not None and reason.startswith("rank 1 has not answered its heartbeat for 2.2 s")


def test_an_ordinary_poll_gap_is_not_a_pause():
    clock = Clock()
    wd = _watchdog(clock, ranks=2)
    for _ in range(50):
        clock.t += wdm.STALL_S * 0.9
        assert wd.tick() == 0.0
    assert wd.lost == 0.0 and wd.check() is not None and "rank 1" in wd.check()
