"""The draft price (engine/draft.py) and the accept rule (engine/verify.py): pure CPU."""
import pytest

from cupyglm.engine.draft import PROBE_EVERY, RATE_WEIGHT, Pricer
from cupyglm.engine.grammar import Guide
from cupyglm.engine.request import Request
from cupyglm.engine.sampling import SamplingParams
from cupyglm.engine.verify import accept


def req(max_tokens=100, out=0, draft=None, guide=None):
    r = Request(1, (1, 2, 3), SamplingParams(max_tokens=max_tokens, draft=draft, guide=guide), max_tokens)
    r.output = [5] * out
    return r


def test_accept_takes_the_agreeing_prefix_and_the_draw_after_it():
    assert accept((4, 5, 6), [4, 5, 6, 7]) == [4, 5, 6, 7]        # all accepted + the bonus draw
    assert accept((4, 5, 6), [4, 9, 6, 7]) == [4, 9]               # first draft right, second wrong
    assert accept((4, 5, 6), [3, 5, 6, 7]) == [3]                  # nothing accepted: the serial token
    assert accept((), [8]) == [8]


def test_price_drafts_when_acceptance_pays_and_skips_when_it_loses():
    p = Pricer(3, 45)
    assert p.best(0.9) == 3 and p.best(0.0) == 0 and p.best(0.3) == 0
    assert 0 < p.best(0.7) <= 3
    for rate in (0.0, 0.2, 0.5, 0.7, 0.9, 1.0):                    # a chosen n never loses to n = 0 by the rule
        n = p.best(rate)
        gain = sum(rate ** k for k in range(n + 1)) / (1 + n * p.mtp_cost + (1 - rate ** n))
        assert gain >= 1.0


def test_choose_respects_room_the_request_flag_and_probes():
    p = Pricer(3, 45)
    assert p.choose(req()) == 3                                    # optimistic start
    assert p.choose(req(max_tokens=10, out=8)) == 1                # never past what it may still generate
    assert p.choose(req(max_tokens=10, out=9)) == 0
    assert p.choose(req(draft=False)) == 0
    assert p.choose(req(draft=True, guide=Guide("regex", "a+"))) == 0   # a grammar masks one row at a time
    r = req()
    for _ in range(12):
        p.observe(r, 3, 0)
    assert r.draft_rate == pytest.approx((1 - RATE_WEIGHT) ** 12)          # the average of accepted / proposed
    picks = [p.choose(r) for _ in range(2 * PROBE_EVERY)]
    assert picks.count(1) == 2 and picks.count(0) == 2 * PROBE_EVERY - 2    # skipping, with a probe every 8th
    assert Pricer(3, 45, priced=False).choose(r) == 3
