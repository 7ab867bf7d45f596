"""The scheduler alone (pure CPU), with exact page ids."""
import pytest

from cupyglm.engine.config import EngineConfig
from cupyglm.engine.request import QueueFull, Request, RequestTooLong, Status
from cupyglm.engine.sampling import SamplingParams
from cupyglm.engine.scheduler import Scheduler

EOS = 99


def cfg(**kw):
    base = dict(context=64, num_pages=8, page_tokens=4, keep_grid=8, parallel=2, max_queue=2, prefill_chunk=16,
                eos_token_ids=(EOS,))
    base.update(kw)
    return EngineConfig(**base)


def req(rid, n, max_tokens=4, **params):
    return Request(rid, tuple(range(1, n + 1)), SamplingParams(temperature=0, max_tokens=max_tokens, **params),
                   max_tokens=max_tokens)


def groups(plan):
    return [(g.request_id, g.start, g.count, g.logits, g.decode) for g in plan.groups]


def test_lease_order_decode_and_release_on_finish():
    s = Scheduler(cfg())
    s.add(req(1, 10, max_tokens=3))          # 12 positions: 3 pages
    s.add(req(2, 5, max_tokens=4))           # 8 positions: 2 pages
    p = s.schedule()
    assert p.admitted == (1, 2)
    assert groups(p) == [(1, 0, 10, True, False), (2, 0, 5, True, False)]
    assert s.requests[1].pages == [0, 1, 2] and s.requests[2].pages == [3, 4]
    assert s.pool.free_ids() == [5, 6, 7]
    ev = s.update(p, {1: 50, 2: 51})
    assert [(r.id, t, why) for r, t, why in ev] == [(1, 50, None), (2, 51, None)]
    p = s.schedule()
    assert groups(p) == [(1, 10, 1, True, True), (2, 5, 1, True, True)]
    assert p.groups[0].tokens == (50,)
    s.update(p, {1: 52, 2: 53})
    p = s.schedule()
    assert groups(p) == [(1, 11, 1, True, True), (2, 6, 1, True, True)]
    ev = s.update(p, {1: 54, 2: 55})
    assert [(r.id, why) for r, _, why in ev] == [(1, "length"), (2, None)]
    assert s.requests.get(1) is None and s.pool.free_ids() == [0, 1, 2, 5, 6, 7]   # released at once
    p = s.schedule()
    assert p.released == (1,) and groups(p) == [(2, 7, 1, True, True)]
    ev = s.update(p, {2: EOS})
    assert ev[0][2] == "stop"
    assert s.pool.free_ids() == list(range(8)) and not s.running
    assert s.schedule().released == (2,)
    assert not s.has_work()


def test_chunks_end_on_the_keep_grid_and_share_the_budget():
    s = Scheduler(cfg(num_pages=16, context=64))
    s.add(req(1, 20))
    s.add(req(2, 20))
    p = s.schedule()
    assert groups(p) == [(1, 0, 16, False, False)]                    # the budget (16) is spent
    p2 = s.update(p, {}) or s.schedule()
    assert groups(p2) == [(1, 16, 4, True, False), (2, 0, 8, False, False)]   # 12 left -> 8 on the grid
    s.update(p2, {1: 7})
    p3 = s.schedule()
    assert groups(p3) == [(1, 20, 1, True, True), (2, 8, 12, True, False)]    # decode rides with a chunk
    for g in p.groups + p2.groups + p3.groups:
        if not g.decode and not g.logits:
            assert g.end % 8 == 0
    assert s.requests[1].pages == [0, 1, 2, 3, 4, 7] and s.requests[2].pages == [5, 6, 8, 9, 10]   # interleaved


def test_chunk_size_whole_prompt_and_grid_multiples():
    with pytest.raises(ValueError, match="multiple of the keep grid"):
        cfg(prefill_chunk=12)
    s = Scheduler(cfg(num_pages=16, prefill_chunk=24))
    s.add(req(1, 40))
    ends = []
    while s.requests[1].prefilling:
        p = s.schedule()
        ends.append(p.groups[0].end)
        s.update(p, {1: 3} if p.groups[0].logits else {})
    assert ends == [24, 40]


def test_abort_frees_pages_at_once():
    s = Scheduler(cfg())
    s.add(req(1, 10))
    s.add(req(2, 6))
    s.add(req(3, 3))
    p = s.schedule()
    assert s.requests[1].pages == [0, 1, 2] and s.requests[2].pages == [3, 4]
    assert s.abort(1).finish_reason == "abort"
    assert s.pool.free_ids() == [0, 1, 2, 5, 6, 7]
    assert s.abort(3).status is Status.FINISHED            # waiting: no pages, never announced
    assert s.abort(3) is None
    s.update(p, {1: 5, 2: 6})                               # the aborted request's token is dropped
    p = s.schedule()
    assert p.released == (1,)                               # 3 was never announced
    assert groups(p) == [(2, 6, 1, True, True)]


def test_queue_bound():
    s = Scheduler(cfg(parallel=2, max_queue=2))
    for i in range(4):                                      # 2 free streams + 2 waiting
        s.add(req(i, 3, max_tokens=1))
    with pytest.raises(QueueFull):
        s.add(req(9, 3))
    s.schedule()                                            # admits 0 and 1; 2 and 3 wait
    with pytest.raises(QueueFull):
        s.add(req(9, 3))
    with pytest.raises(ValueError, match="already in use"):
        s.add(req(2, 3))


def test_waits_when_out_of_pages():
    s = Scheduler(cfg(parallel=4))
    s.add(req(1, 20, max_tokens=4))          # 23 positions: 6 of the 8 pages reserved
    s.add(req(2, 8, max_tokens=4))           # 11 positions: 3 pages: must wait
    p = s.schedule()
    assert p.admitted == (1,) and groups(p) == [(1, 0, 16, False, False)]
    assert s.requests[2].status is Status.WAITING
    assert s.requests[1].pages == [0, 1, 2, 3]
    s.update(p, {})
    p = s.schedule()
    assert p.admitted == () and s.requests[1].pages == [0, 1, 2, 3, 4]
    s.update(p, {1: 5})
    s.abort(1)
    p = s.schedule()
    assert p.admitted == (2,) and s.requests[2].pages == [0, 1]


def test_request_too_long_before_any_page():
    s = Scheduler(cfg(context=64, num_pages=8))
    with pytest.raises(RequestTooLong, match="^prompt of 60 tokens \\+ max_tokens 10 exceeds the context window "
                                             "of 64$"):
        s.add(req(1, 60, max_tokens=10))
    with pytest.raises(RequestTooLong, match="needs 10 KV pages of 4 tokens; the pool has 8"):
        s.add(req(2, 30, max_tokens=10))
    with pytest.raises(RequestTooLong, match="leaves no room"):
        s.resolve_max_tokens(64, None)
    assert Scheduler(cfg(context=32)).resolve_max_tokens(20, None) == 12
    assert s.pool.free_count == 8 and not s.requests
