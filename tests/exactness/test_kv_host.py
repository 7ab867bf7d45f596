"""KV rows in host memory (CUPYGLM_KV_HOST): the tokens and logits of the device-resident run, bit for bit,
through the gather (kv/host_rows.py, op kv_gather); the slot guard refuses a call past its slots by name.

Prompts cross the tiny model's dense/sparse limit (sparse from position 35) and several 16-token pages;
concurrent prompts share the call (each segment gathers alone) and reply as alone.
"""
import numpy as np

from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.backend.sim_ops import SimOps
from cupyglm.distributed.comm import LocalComm
from cupyglm.engine.config import EngineConfig
from cupyglm.engine.engine import Engine
from cupyglm.engine.runner import ModelRunner
from cupyglm.engine.sampling import SamplingParams
from cupyglm.kv.host_rows import slots_message
from cupyglm.model.glm import SeqInput


def make_engine(ckpt, host_slots=0, parallel=4, pages=96, context=512, ops=None):
    c = ckpt.config
    runner = ModelRunner(ckpt, ops or NumpyOps(), LocalComm(), pages, 16, poison=True, host_slots=host_slots)
    cfg = EngineConfig(context=context, num_pages=pages, page_tokens=16, keep_grid=c.keep_grid, parallel=parallel,
                       seed=0, eos_token_ids=c.eos_token_ids, vocab_size=c.vocab_size, poison=True)
    return Engine(runner, LocalComm(), cfg, ckpt.tokenizer)


def run(engine, prompts, params):
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    got = {i: [] for i in ids}
    ends = {}
    while engine.has_work():
        for out in engine.step():
            got[out.request_id] += out.new_token_ids
            if out.finished:
                ends[out.request_id] = (out.finish_reason, getattr(out, "error", None))
    assert engine.free_pages == engine.total_pages
    return [got[i] for i in ids], [ends[i] for i in ids]


def prompts(lengths, seed=7):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 496, n).tolist() for n in lengths]


def test_host_rows_logits_bit_identical(tiny_ckpt):
    """Every step's logits of a 100-token prompt and 6 decode steps equal the device-resident run's bits."""
    def logits(host_slots):
        runner = ModelRunner(tiny_ckpt, NumpyOps(), LocalComm(), 16, 16, poison=True, host_slots=host_slots)
        assert (runner.kv.host is not None) == bool(host_slots)
        st = runner.new_state()
        toks, seen = np.asarray(prompts([100])[0], np.int32), []
        for _ in range(6):
            lg = runner.forward([SeqInput(toks, st, all_logits=True)])[0].logits
            seen.append(np.ascontiguousarray(lg, dtype=np.float32).view(np.uint32).copy())
            toks = np.array([int(np.argmax(lg[-1]))], np.int32)
        runner.release(st)
        return seen
    a, b = logits(0), logits(256)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_host_rows_tokens_equal_concurrent(tiny_ckpt):
    """Prompts of 30 and 200 tokens (dense and sparse), greedy 24 tokens, together and alone, host = device."""
    ps = prompts([30, 200, 37, 120])
    params = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True) for _ in ps]
    dev, _ = run(make_engine(tiny_ckpt), ps, params)
    host, _ = run(make_engine(tiny_ckpt, host_slots=512), ps, params)
    assert host == dev
    alone = [run(make_engine(tiny_ckpt, host_slots=512), [p], [sp])[0][0] for p, sp in zip(ps[:2], params[:2])]
    assert alone == dev[:2]


def test_host_rows_sim_equals_numpy(tiny_ckpt):
    """The gather kernels on the emulator: the same tokens as the numpy device-resident run."""
    ps = prompts([50])
    params = [SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)]
    dev, _ = run(make_engine(tiny_ckpt), ps, params)
    sim, _ = run(make_engine(tiny_ckpt, host_slots=128, ops=SimOps()), ps, params)
    assert sim == dev


def test_slot_guard_refuses_by_name_then_next_succeeds(tiny_ckpt):
    """With 40 slots a 100-token prompt's segment needs more distinct rows: refused by name, no row left
    marked, every page free; a 20-token request (dense, at most 20 + 8 rows) then succeeds unchanged."""
    eng = make_engine(tiny_ckpt, host_slots=40)
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    toks, ends = run(eng, prompts([100]), [sp])
    assert ends[0] == ("error", slots_message(40)) and toks == [[]]
    host = eng.runner.kv.host
    assert (np.asarray(host.marks) == -1).all() and not np.asarray(host.flags).any()
    ok, ends2 = run(eng, prompts([20]), [sp])
    want, _ = run(make_engine(tiny_ckpt), prompts([20]), [sp])
    assert ok == want and ends2[0][0] == "length"


def test_row_cache_hits_and_forgets_when_pages_change_hands(tiny_ckpt):
    """Decode segments hit the row cache; a second sequence on the pages the first released gets the logits of
    a fresh device-resident run, bit for bit (the cache was forgotten when the pages changed hands)."""
    def logits(runner, prompt, steps=12):
        st, toks, seen = runner.new_state(), np.asarray(prompt, np.int32), []
        for _ in range(steps):
            lg = runner.forward([SeqInput(toks, st)])[0].logits
            seen.append(np.ascontiguousarray(lg, dtype=np.float32).view(np.uint32).copy())
            toks = np.array([int(np.argmax(lg[-1]))], np.int32)
        runner.release(st)
        return seen

    a, b = prompts([200, 150], seed=3)
    host = ModelRunner(tiny_ckpt, NumpyOps(), LocalComm(), 16, 16, poison=True, host_slots=256)
    dev = ModelRunner(tiny_ckpt, NumpyOps(), LocalComm(), 16, 16, poison=True)
    logits(host, a)
    stats = host.kv.host.take_stats()
    got, want = logits(host, b), logits(dev, b)
    assert all(np.array_equal(x, y) for x, y in zip(got, want))
    assert stats["hits"] > 0 and stats["misses"] > 0 and 0 < stats["bytes_per_decode_token"]
