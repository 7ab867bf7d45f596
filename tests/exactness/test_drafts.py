"""Drafted equals serial, through the engine at TP=1 (in-process), with the MTP head and test-only proposers.

- The MTP proposer (random tiny weights: it is rarely right): output equals a serial engine's, greedy and seeded,
  stop strings and ids, min_tokens, penalties and logprobs.
- An oracle proposer that proposes exactly what serial decoding will produce: every draft accepted, N at a time.
- A proposer wrong at chosen draft positions: output equals serial, and after every step's rollback the KV rows,
  pooled keys, KDA states, conv windows, index tails, MTP pending row and page accounting equal the serial run's
  at the same length; rows past the accepted prefix are poisoned after each rollback and never read.
"""
from dataclasses import replace

import numpy as np
import pytest
from model_helpers import tail_fill

from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.distributed.comm import LocalComm
from cupyglm.engine.config import EngineConfig
from cupyglm.engine.engine import Engine
from cupyglm.engine.runner import ModelRunner
from cupyglm.engine.sampling import SamplingParams

PAGE = 16


def make_engine(ckpt, drafts=0, pricing=False, parallel=4, pages=96, context=256):
    c = ckpt.config
    runner = ModelRunner(ckpt, NumpyOps(), LocalComm(), pages, PAGE, mtp=True, poison=True)
    cfg = EngineConfig(context=context, num_pages=pages, page_tokens=PAGE, keep_grid=c.keep_grid,
                       parallel=parallel, seed=0, eos_token_ids=c.eos_token_ids, vocab_size=c.vocab_size,
                       poison=True, mtp_drafts=drafts, draft_pricing=pricing)
    return Engine(runner, LocalComm(), cfg, ckpt.tokenizer)


def run(engine, prompts, params):
    """-> per prompt (token ids, text, finish reason, usage-style (proposed, accepted), logprobs)."""
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    got = {i: [[], [], None, [0, 0], []] for i in ids}
    while engine.has_work():
        for out in engine.step():
            g = got[out.request_id]
            g[0] += out.new_token_ids
            g[1].append(out.new_text)
            g[4] += out.logprobs or []
            if out.draft:
                g[3][0] += out.draft[0]
                g[3][1] += out.draft[1]
            if out.finished:
                g[2] = out.finish_reason
    assert engine.free_pages == engine.total_pages
    return [(got[i][0], "".join(got[i][1]), got[i][2], tuple(got[i][3]), got[i][4]) for i in ids]


def prompts():
    rng = np.random.default_rng(11)
    return [rng.integers(0, 496, n).tolist() for n in (5, 37, 70, 12)]


PARAMS = [
    SamplingParams(temperature=0, max_tokens=24),
    SamplingParams(temperature=0.8, top_p=0.9, seed=1, max_tokens=20, logprobs=2),
    SamplingParams(temperature=1.0, top_k=20, seed=5, max_tokens=18, min_tokens=6, frequency_penalty=0.5),
    SamplingParams(temperature=0, max_tokens=22, min_tokens=5, repetition_penalty=1.3, stop_token_ids=(7,)),
]


class Oracle:
    """Proposes the serial continuation (request id -> (prompt length, serial output)); `wrong(k, j)` makes the
    j-th draft of the k-th proposal of a request wrong."""

    def __init__(self, serial: dict, vocab: int, wrong=lambda k, j: False):
        self.serial, self.vocab, self.wrong = serial, vocab, wrong
        self.calls: dict[int, int] = {}

    def propose(self, drafts):
        out = {}
        for d in drafts:
            plen, toks = self.serial[d.request_id]
            at = d.start - plen                                   # index of d.token in the output
            assert toks[at] == d.token
            k = self.calls[d.request_id] = self.calls.get(d.request_id, -1) + 1
            got = []
            for j in range(d.n):
                t = toks[at + 1 + j] if at + 1 + j < len(toks) else 0
                got.append((t + 1) % self.vocab if self.wrong(k, j) else t)
            out[d.request_id] = tuple(got)
        return out


@pytest.fixture(scope="module")
def serial(tiny_ckpt):
    ps = prompts()
    return ps, run(make_engine(tiny_ckpt), ps, PARAMS)


def test_mtp_drafts_equal_serial(tiny_ckpt, serial):
    ps, want = serial
    stop = want[0][1][4:6]
    params = [replace(PARAMS[0], stop=(stop,))] + PARAMS[1:]
    want0 = run(make_engine(tiny_ckpt), ps[:1], params[:1])[0]
    got = run(make_engine(tiny_ckpt, drafts=3), ps, params)
    assert got[0][:3] == want0[:3]
    for g, w in zip(got[1:], want[1:]):
        assert g[:3] == w[:3]
        assert g[4] == w[4]                                        # logprobs too
    assert all(g[3][0] > 0 for g in got)                           # every request verified drafts


@pytest.mark.parametrize("n", [1, 4, 15])
def test_oracle_accepts_every_draft(tiny_ckpt, serial, n):
    ps, want = serial
    eng = make_engine(tiny_ckpt, drafts=n)
    ids = list(range(len(ps)))
    eng.verifier.proposer = Oracle({i: (len(p), w[0]) for i, p, w in zip(ids, ps, want)}, tiny_ckpt.config.vocab_size)
    got = run(eng, ps, PARAMS)
    for g, w in zip(got, want):
        assert g[:3] == w[:3]
        assert g[4] == w[4]
        proposed, accepted = g[3]
        assert proposed == accepted > 0                            # every draft accepted
    steps = eng.steps
    assert eng.verifier.replayed_rows == 0
    assert steps < sum(len(w[0]) for w in want) // 2               # several tokens a step


def _kv_view(model, state):
    """What a sequence of length L has written that a later step may read: main DSA rows and pooled keys to L,
    MTP rows to L - 1 (its row L - 1 waits for the next token), the fixed state, the page count."""
    kv, cfg = model.kv, model.cfg
    L = state.length
    out = {}
    for l in cfg.kv_layers:
        upto = L - 1 if l == cfg.mtp_layer else L
        out[f"latent{l}"] = np.asarray(kv.latent[l][kv.rows(state.pages, np.arange(upto))]).tobytes()
        out[f"pooled{l}"] = np.asarray(kv.pooled[l][kv.pool_rows(state.pages, np.arange(upto // 4))]).tobytes()
    out.update({f"kda{l}": np.asarray(s).tobytes() for l, s in state.kda_state.items()})
    out.update({f"conv{l}": np.asarray(s).tobytes() for l, s in state.kda_conv.items()})
    out.update({f"tail{l}": b"".join(np.asarray(a).tobytes() for a in t) for l, t in state.index_tail.items()})
    out.update({f"fill{l}": b"".join(np.asarray(a[:tail_fill(cfg, l, L)]).tobytes() for a in t)
                for l, t in state.index_tail.items()})
    out["mtp_pending"] = np.asarray(state.mtp_pending).tobytes()
    return out


def _pages(engine, rid):
    r = engine.scheduler.requests.get(rid)
    return None if r is None else (r.fed, len(r.pages), engine.scheduler.pool.free_count)   # the plan's pool


def _poison_past(model, state):
    """NaN into every row the sequence holds past what it has written (rejected rows, the MTP row L - 1)."""
    kv, cfg = model.kv, model.cfg
    L, cap = state.length, len(state.pages) * PAGE
    for l in cfg.kv_layers:
        frm = L - 1 if l == cfg.mtp_layer else L
        if cap > frm:
            kv.latent[l][kv.rows(state.pages, np.arange(frm, cap))] = np.nan
        pools = np.arange(frm // 4, cap // 4)
        if pools.size:
            kv.pooled[l][kv.pool_rows(state.pages, pools)] = np.nan


@pytest.mark.parametrize("params", [PARAMS[0], PARAMS[1]], ids=["greedy", "seeded"])
def test_rollback_leaves_no_trace(tiny_ckpt, params):
    n = 4
    prompt = prompts()[2]
    ser = make_engine(tiny_ckpt)
    rid = ser.add_request(prompt, params)
    views, serial_out, pages = {}, [], set()
    while ser.has_work():
        state = ser._states.get(rid)
        for o in ser.step():
            serial_out += o.new_token_ids
        state = ser._states.get(rid, state)
        if state.length and state.pages:
            views[state.length] = _kv_view(ser.runner.model, state)
        pages.add(_pages(ser, rid))
    # the k-th proposal is wrong at draft k % (n + 1): rejections at every draft position, and full accepts
    eng = make_engine(tiny_ckpt, drafts=n)
    eng.verifier.proposer = Oracle({0: (len(prompt), serial_out)}, tiny_ckpt.config.vocab_size,
                                   wrong=lambda k, j: j == k % (n + 1))
    model, checked = eng.runner.model, []
    settle = eng.verifier.settle

    def checked_settle(schedule, states):
        rolled = [e.request_id for e in schedule if e.request_id in eng.verifier.pending]
        settle(schedule, states)
        for r in rolled:
            st = states[r]
            a, b = _kv_view(model, st), views[st.length]
            assert a == b, f"state at {st.length} differs from serial in {[k for k in a if a[k] != b[k]]}"
            checked.append(st.length)
            _poison_past(model, st)

    eng.verifier.settle = checked_settle
    update = eng.scheduler.update

    def checked_update(plan, sampled):
        events = update(plan, sampled)
        got = _pages(eng, 0)
        assert got in pages, f"(fed, pages held, pool free) {got} is no serial step's"
        return events

    eng.scheduler.update = checked_update
    got = []
    eng.add_request(prompt, params, request_id=0)
    while eng.has_work():
        for o in eng.step():
            got += o.new_token_ids
    assert got == serial_out
    assert len(checked) >= 4 and eng.verifier.replayed_rows > 0


def test_resumed_turn_drafts_and_equals_cold_serial(tiny_ckpt):
    """The prompt cache with the MTP head: a turn resumed from a kept state (the MTP layer's rows, index tail
    and pending row kept too) drafts and gives a cold serial engine's tokens."""
    from cupyglm.kv.kept import KeptStore

    c, ops = tiny_ckpt.config, NumpyOps()
    pages = 48
    runner = ModelRunner(tiny_ckpt, ops, LocalComm(), pages, PAGE, mtp=True, poison=True)
    probe = KeptStore(c, ops, runner.kv, 1, 1 << 30, mtp=True)
    kept = KeptStore(c, ops, runner.kv, 1, 400 * probe.page_bytes, mtp=True)
    cfg = EngineConfig(context=pages * PAGE, num_pages=pages, page_tokens=PAGE, keep_grid=c.keep_grid,
                       parallel=2, prefill_chunk=c.keep_grid, eos_token_ids=c.eos_token_ids,
                       vocab_size=c.vocab_size, poison=True, mtp_drafts=3, draft_pricing=False)
    warm = Engine(runner, LocalComm(), cfg, None, kept=kept)
    rng = np.random.default_rng(5)
    first = rng.integers(3, 400, c.keep_grid + 9).tolist()
    params = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
              SamplingParams(temperature=0.9, seed=4, max_tokens=12, ignore_eos=True)]
    for sp in params:
        turn1 = run(warm, [first], [sp])[0]
        second = first + turn1[0] + rng.integers(3, 400, 7).tolist()
        ids = warm.add_request(second, sp)
        toks, cached, drafted = [], None, [0, 0]
        while warm.has_work():
            for o in warm.step():
                toks += o.new_token_ids
                cached = o.cached_tokens
                drafted = [drafted[0] + o.draft[0], drafted[1] + o.draft[1]]
        cold = run(make_engine(tiny_ckpt, pages=pages, context=pages * PAGE), [second], [sp])[0]
        assert cached >= len(first) and drafted[0] > 0, (ids, cached, drafted)
        assert toks == cold[0]
