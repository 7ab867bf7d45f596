"""CUDA graphs of decode calls (engine/graph_capture.py) through the CuPy double, whose stream capture records
work instead of running it and replays it on the same allocations (tests/cupy_double/capture.py):

* replay = eager, bit for bit (logits, hence tokens), for decode steps at several context lengths (one past the
  sparse limit) and batch sizes 1..5 (buckets 1, 2, 4, 8), the graphs captured once and replayed after;
* the same with sequences joining and leaving, verify rows (several rows of one sequence, run in order), mixed
  and prompt calls between replays (a seated sequence leaves its KDA slot and moves back), more sequences than
  slots (seats evicted), up to 16 rows;
* a released sequence vacates its seat with no copy: the next sequence takes that slot, nothing evicted;
* a state kept while seated and restored into a fresh sequence decodes through the graphs as the fresh run;
* padded = unpadded: a 3-row call in the 4-row bucket gives each row's bits of the same rows eager and of each
  row alone;
* the captured ends (engine/graph_ends.py): the logits row map follows all_logits per sequence (several rows of a
  sequence, some wanting every row's logits, some the last), a new map each call of the same graphs;
* host launches per decode token drop, the graph launches and the kernels inside them counted apart;
* the engine with graphs (batches shrinking as requests finish; MTP verify groups and rollback replays) gives
  the numpy engine's tokens.
"""
from __future__ import annotations

import numpy as np
import pytest

import cupy_double
from cupy_double.fixtures import cuda_double_module, cuda_ops, graph_runner as _runner  # noqa: F401
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.distributed.comm import LocalComm
from cupyglm.engine.config import EngineConfig
from cupyglm.engine.engine import Engine
from cupyglm.engine.runner import ModelRunner
from cupyglm.engine.sampling import SamplingParams
from cupyglm.model.glm import SeqInput
from cupyglm.engine.kda_slots import KDASlots
from model_helpers import bits

PROMPTS = [[5, 17, 300, 42], list(range(60, 100)), [7] * 13, [9, 8, 7, 6, 5, 4], [11] * 21]


def _step(runner, ops, states, feed, decode: bool) -> list[np.ndarray]:
    out = runner.forward([SeqInput(f, s, decode=decode) for f, s in zip(feed, states)])
    return [ops.asnumpy(o.logits[-1]) for o in out]


def test_graph_replay_equals_eager_across_buckets_and_lengths(tiny_ckpt, cuda_ops):
    eager, graph = _runner(tiny_ckpt, cuda_ops, False), _runner(tiny_ckpt, cuda_ops, True)
    es, gs = [eager.new_state() for _ in PROMPTS], [graph.new_state() for _ in PROMPTS]
    feed = [np.asarray(p, np.int32) for p in PROMPTS]
    _step(eager, cuda_ops, es, feed, False)
    last = _step(graph, cuda_ops, gs, feed, False)
    tokens = [np.array([int(np.argmax(r))], np.int32) for r in last]
    # which sequences decode together at each step: 5 rows (bucket 8), 3 (4), 1, 2, 3 again (replays), 5 again
    plan = [[0, 1, 2, 3, 4], [0, 1, 2], [1], [3, 4], [0, 1, 2], [4], [0, 1, 2, 3, 4], [0, 1, 2]]
    for step, who in enumerate(plan):
        want = _step(eager, cuda_ops, [es[i] for i in who], [tokens[i] for i in who], True)
        got = _step(graph, cuda_ops, [gs[i] for i in who], [tokens[i] for i in who], True)
        for i, w, g in zip(who, want, got):
            assert np.isfinite(g).all(), f"step {step} seq {i}: non-finite logits (a poisoned buffer read?)"
            assert np.array_equal(bits(w), bits(g)), f"step {step} seq {i}: max diff {np.abs(w - g).max()}"
            tokens[i] = np.array([int(np.argmax(w))], np.int32)
    layers = tiny_ckpt.config.num_hidden_layers
    assert {b for _, b in graph.graphs.entries} == {1, 2, 4, 8}
    assert len(graph.graphs.entries) == 4 * layers                 # captured once per (layer, bucket)
    assert graph.graphs.replays == len(plan) * layers
    ends = graph.ends
    assert set(ends.buckets) == {1, 2, 4, 8} and ends.replays == 2 * len(plan)     # entry and exit each call
    for bb, e in ends.buckets.items():                              # chained: layer 0 reads the entry's outputs, the
        assert graph.graphs.entries[(0, bb)].static is e.enter[1]   # exit the last layer's X, nothing copied
        assert e.exit[1] is graph.graphs.entries[(layers - 1, bb)].out[0]
    _memory_within_the_plan(tiny_ckpt.config, graph.graphs, cuda_ops)


def _memory_within_the_plan(cfg, graphs, ops) -> None:
    """The seats hold exactly what the plan counts for the buckets used; each bucket's pool stays within its bound."""
    from cupyglm.engine.plan_graphs import graph_pool_bytes
    from cupyglm.memory import graph_slot_arrays, storage_of, total_bytes

    storage, slots = storage_of(ops), graphs.slots
    assert slots.nbytes() == total_bytes(graph_slot_arrays(cfg, 1, slots.n, tuple(sorted(slots.seg))), storage)
    for b, pool in graphs.pools.items():
        held, bound = pool.total_bytes(), graph_pool_bytes(cfg, 1, storage, b)
        print(f"bucket {b}: pool {held:,} B, plan's bound {bound:,} B")
        assert held <= bound, f"bucket {b}: the pool holds {held:,} B, past the plan's bound {bound:,} B"


def _call(runner, ops, items) -> list[np.ndarray]:
    """items: (state, tokens, decode) -> every row's logits."""
    out = runner.forward([SeqInput(t, s, all_logits=True, decode=d) for s, t, d in items])
    return [ops.asnumpy(o.logits) for o in out]


def test_replay_equals_eager_with_sequences_joining_leaving_verify_rows_and_evictions(tiny_ckpt, cuda_ops):
    eager, graph = _runner(tiny_ckpt, cuda_ops, False), _runner(tiny_ckpt, cuda_ops, True)
    graph.graphs.slots = KDASlots(cuda_ops.xp, n=4)                 # 6 sequences over 4 slots: seats evicted
    prompts = PROMPTS + [[3, 1, 4, 1, 5, 9, 2, 6]]
    es, gs = [eager.new_state() for _ in prompts], [graph.new_state() for _ in prompts]
    rng = np.random.default_rng(3)
    P, D = "prompt", "decode"
    # each step one call: (sequence, kind, rows); a prompt row in a call makes it eager (mixed)
    plan = [[(0, P, 0), (1, P, 0), (2, P, 0)],
            [(0, D, 1), (1, D, 1), (2, D, 1)],                      # bucket 4
            [(0, D, 4), (2, D, 1)],                                 # verify rows: 5 rows, bucket 8
            [(3, P, 0), (4, P, 0)],                                 # two sequences join (eager prompts)
            [(3, D, 1), (1, D, 1), (4, D, 1), (0, D, 1)],           # s2 absent, its seat taken: evicted
            [(2, D, 3), (3, D, 1)],                                 # s2 back (moved in), verify rows
            [(5, P, 0), (1, D, 1)],                                 # mixed call: eager, s1 leaves its slot
            [(1, D, 1), (5, D, 2), (0, D, 1), (4, D, 1)],           # s1 moved back, s5 joins
            [(0, D, 4), (1, D, 4), (2, D, 4), (3, D, 4)]]           # 16 rows
    for step, call in enumerate(plan):
        feed = [np.asarray(prompts[i], np.int32) if kind == P else rng.integers(0, 400, n).astype(np.int32)
                for i, kind, n in call]
        want = _call(eager, cuda_ops, [(es[i], f, kind == D) for (i, kind, _), f in zip(call, feed)])
        got = _call(graph, cuda_ops, [(gs[i], f, kind == D) for (i, kind, _), f in zip(call, feed)])
        for (i, _, _), w, g in zip(call, want, got):
            assert np.isfinite(g).all(), f"step {step} seq {i}: non-finite logits"
            assert np.array_equal(bits(w), bits(g)), f"step {step} seq {i}: max diff {np.abs(w - g).max()}"
    slots = graph.graphs.slots
    assert slots.evictions > 0 and slots.moves > 0
    assert {b for _, b in graph.graphs.entries} == {4, 8, 16}


def test_a_released_sequence_gives_its_seat_to_the_next_without_a_copy(tiny_ckpt, cuda_ops):
    """runner.release vacates a finished sequence's KDA seat though its state lives on (the caller holds it): the
    sequence joining next takes that exact slot, nothing is evicted, and every row keeps eager's bits."""
    eager, graph = _runner(tiny_ckpt, cuda_ops, False), _runner(tiny_ckpt, cuda_ops, True)
    slots = graph.graphs.slots = KDASlots(cuda_ops.xp, n=2)
    es, gs = [eager.new_state() for _ in range(3)], [graph.new_state() for _ in range(3)]
    feed = [np.asarray(p, np.int32) for p in PROMPTS[:3]]
    _call(eager, cuda_ops, [(s, f, False) for s, f in zip(es, feed)])
    _call(graph, cuda_ops, [(s, f, False) for s, f in zip(gs, feed)])
    rng = np.random.default_rng(11)
    for step, who in enumerate([[0, 1], [0, 1], [2, 1], [2, 1]]):
        if step == 2:
            eager.release(es[0])
            graph.release(gs[0])
        toks = [rng.integers(0, 400, 1).astype(np.int32) for _ in who]
        want = _call(eager, cuda_ops, [(es[i], t, True) for i, t in zip(who, toks)])
        got = _call(graph, cuda_ops, [(gs[i], t, True) for i, t in zip(who, toks)])
        for i, w, g in zip(who, want, got):
            assert np.array_equal(bits(w), bits(g)), f"step {step} seq {i}: max diff {np.abs(w - g).max()}"
        assert [slots._seated(gs[i]) for i in who] == [0, 1]          # seq 2 in seq 0's slot from step 2
    assert slots.evictions == 0                    # the finished sequence was not copied out
    assert slots._seated(gs[0]) is None and slots.releases == 1
    kda = len(tiny_ckpt.config.kda_layers)
    assert slots.moves == 3 * 2 * kda              # each sequence's two arrays moved in once per KDA layer


def test_kept_state_resumed_through_graphs_equals_fresh(tiny_ckpt, cuda_ops):
    """A state kept while it sits in its KDA slot (the walk copies from the slot's addresses) and restored into a
    fresh sequence decodes through the graphs with the bits of the uninterrupted eager run."""
    from cupyglm.kv.kept import KeptStore

    eager, graph = _runner(tiny_ckpt, cuda_ops, False), _runner(tiny_ckpt, cuda_ops, True)
    kept = KeptStore(tiny_ckpt.config, cuda_ops, graph.kv, 1, 1 << 22)
    prompt = np.asarray(PROMPTS[1], np.int32)
    e, a, other = eager.new_state(), graph.new_state(), graph.new_state()
    _call(eager, cuda_ops, [(e, prompt, False)])
    _call(graph, cuda_ops, [(a, prompt, False), (other, np.asarray(PROMPTS[0], np.int32), False)])
    rng = np.random.default_rng(5)
    feeds = [rng.integers(0, 400, n).astype(np.int32) for n in (1, 2, 1, 3, 1)]
    for f in feeds[:2]:
        _call(eager, cuda_ops, [(e, f, True)])
        _call(graph, cuda_ops, [(a, f, True), (other, f[:1], True)])
    kept.keep(1, a, range(kept.pages_for(a.length)))
    for f in feeds[2:]:                                              # a runs on: its slot changes after the keep
        _call(graph, cuda_ops, [(other, f[:1], True), (a, f, True)])
    b = graph.new_state()
    graph.kv.ensure(b.pages, a.length - sum(f.size for f in feeds[2:]))
    kept.restore(1, b)
    for f in feeds[2:]:
        want = _call(eager, cuda_ops, [(e, f, True)])[0]
        got = _call(graph, cuda_ops, [(b, f, True), (other, f[:1], True)])[0]
        assert np.array_equal(bits(want), bits(got)), f"resumed != fresh: max diff {np.abs(want - got).max()}"
    assert graph.graphs.slots.moves > 0 and graph.graphs.replays > 0


def test_padded_rows_equal_unpadded_and_alone(tiny_ckpt, cuda_ops):
    who = [0, 1, 2]                                      # 3 rows in the 4-row bucket
    graph = _runner(tiny_ckpt, cuda_ops, True)
    eager = _runner(tiny_ckpt, cuda_ops, False)
    alone = [_runner(tiny_ckpt, cuda_ops, False) for _ in who]
    gs, es = [graph.new_state() for _ in who], [eager.new_state() for _ in who]
    ss = [a.new_state() for a in alone]
    feed = [np.asarray(PROMPTS[i], np.int32) for i in who]
    _step(graph, cuda_ops, gs, feed, False)
    _step(eager, cuda_ops, es, feed, False)
    last = [_step(a, cuda_ops, [s], [f], False)[0] for a, s, f in zip(alone, ss, feed)]
    for step in range(3):
        toks = [np.array([int(np.argmax(r))], np.int32) for r in last]
        got = _step(graph, cuda_ops, gs, toks, True)
        want = _step(eager, cuda_ops, es, toks, True)
        solo = [_step(a, cuda_ops, [s], [t], True)[0] for a, s, t in zip(alone, ss, toks)]
        for i in range(len(who)):
            assert np.array_equal(bits(got[i]), bits(want[i])), f"step {step} row {i}: padded != unpadded"
            assert np.array_equal(bits(got[i]), bits(solo[i])), f"step {step} row {i}: padded != alone"
        last = want
    assert set(graph.graphs.entries) == {(layer, 4) for layer in range(tiny_ckpt.config.num_hidden_layers)}


def test_graphs_cut_host_launches_per_decode_token(tiny_ckpt, cuda_ops):
    counts = {}
    for on in (False, True):
        runner = _runner(tiny_ckpt, cuda_ops, on)
        states = [runner.new_state() for _ in range(2)]
        last = _step(runner, cuda_ops, states, [np.asarray(p, np.int32) for p in PROMPTS[:2]], False)
        toks = [np.array([int(np.argmax(r))], np.int32) for r in last]
        _step(runner, cuda_ops, states, toks, True)                  # captures (graphs on)
        with cupy_double.counting() as c:
            _step(runner, cuda_ops, states, toks, True)
        counts[on] = c
    off, on = counts[False], counts[True]
    layers = tiny_ckpt.config.num_hidden_layers
    assert on.graph_launches == layers + 2 and off.graph_launches == 0 and on.captured == 0   # + entry and exit
    assert on.launches + on.graph_launches < off.launches
    kda = len(tiny_ckpt.config.kda_layers)
    assert 0 < kda < layers
    # the same kernels run, fewer from the host, and one kda_step_slots a KDA layer for both sequences' kda_step
    assert on.launches + on.graph_kernels == off.launches - kda
    # + the call's slot table, - one of the ids' and row map's two uploads (one feed)
    assert on.syncs == off.syncs and on.h2d == off.h2d


def test_graph_ends_row_map_follows_all_logits(tiny_ckpt, cuda_ops):
    """Calls of several rows per sequence in one bucket, each sequence wanting every row's logits or its last
    row's: the exit graph's row map picks the eager call's rows, a different map each call."""
    eager, graph = _runner(tiny_ckpt, cuda_ops, False), _runner(tiny_ckpt, cuda_ops, True)
    es, gs = [eager.new_state() for _ in range(3)], [graph.new_state() for _ in range(3)]
    rng = np.random.default_rng(11)
    for run, st in ((eager, es), (graph, gs)):
        run.forward([SeqInput(np.asarray(PROMPTS[i], np.int32), s) for i, s in enumerate(st)])
    plan = [[(3, False), (1, False), (2, True)],                    # 6 rows in bucket 8, rows 2, 3, 4, 5
            [(1, True), (4, False), (2, False)],                    # 7 rows: rows 0, 4, 6
            [(2, True), (2, False), (3, True)]]                     # 7 rows: rows 0, 1, 3, 4, 5, 6
    for step, call in enumerate(plan):
        feed = [rng.integers(0, 400, n).astype(np.int32) for n, _ in call]
        want, got = [[cuda_ops.asnumpy(o.logits) for o in run.forward(
            [SeqInput(f, s, all_logits=a, decode=True) for f, s, (_, a) in zip(feed, st, call)])]
            for run, st in ((eager, es), (graph, gs))]
        for i, ((n, a), w, g) in enumerate(zip(call, want, got)):
            assert g.shape == w.shape == (n if a else 1, w.shape[1])
            assert np.array_equal(bits(w), bits(g)), f"step {step} seq {i}: max diff {np.abs(w - g).max()}"
    assert set(graph.ends.buckets) == {8} and graph.ends.replays == 2 * len(plan)


LENGTHS = [5, 40, 12, 20]
PARAMS = [SamplingParams(temperature=0, max_tokens=6),
          SamplingParams(temperature=0.8, top_p=0.9, seed=1, max_tokens=6),
          SamplingParams(temperature=1.0, top_k=20, seed=5, max_tokens=5),
          SamplingParams(temperature=0.7, min_p=0.1, seed=9, max_tokens=6)]


def _engine(ckpt, ops, graphs: bool, drafts: int) -> Engine:
    c = ckpt.config
    runner = ModelRunner(ckpt, ops, LocalComm(), 32, 16, mtp=drafts > 0, poison=True, graphs=graphs)
    cfg = EngineConfig(context=128, num_pages=32, page_tokens=16, keep_grid=c.keep_grid, parallel=4, seed=0,
                       eos_token_ids=c.eos_token_ids, vocab_size=c.vocab_size, poison=True, mtp_drafts=drafts,
                       draft_pricing=False)
    return Engine(runner, LocalComm(), cfg, ckpt.tokenizer)


def _run(engine, prompts) -> list[list[int]]:
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, PARAMS)]
    got = {i: [] for i in ids}
    while engine.has_work():
        for out in engine.step():
            got[out.request_id] += out.new_token_ids
    assert engine.free_pages == engine.total_pages
    return [got[i] for i in ids]


def test_sampling_parameters_in_one_upload(cuda_ops):
    """engine/step_sample.upload_params: the six columns ops.sample takes, from one host-to-device copy."""
    from cupyglm.engine.draw import upload_params

    dtypes = (np.float32, np.int32, np.float32, np.float32, np.uint64, np.int32)    # ops.sample's columns
    rows = [(0.0, 0, 1.0, 0.0, 2**63 + 5, 7), (0.8, 20, 0.9, 0.1, 1, 9), (1.0, 3, 0.5, 0.25, 12345, 0)]
    with cupy_double.counting() as c:
        got = upload_params(cuda_ops.xp, rows)
    assert c.h2d == 1
    assert len(got) == len(dtypes)
    for col, dt, g in zip(zip(*rows), dtypes, got):
        assert g.dtype == dt and g.flags.c_contiguous and np.array_equal(cuda_ops.asnumpy(g), np.array(col, dt))


@pytest.mark.parametrize("drafts", [0, 3])
def test_engine_with_graphs_equals_numpy(tiny_ckpt, cuda_ops, drafts):
    """4 concurrent mixed-sampling requests (batches shrinking as they finish; with drafts, verify groups and
    rollback replays as decode calls): the tokens of the numpy engine."""
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, 496, n).tolist() for n in LENGTHS]
    eng = _engine(tiny_ckpt, cuda_ops, True, drafts)
    got = _run(eng, prompts)
    assert eng.runner.graphs.replays > 0 and eng.runner.ends.sampled > 0      # plain steps drawn in the exit
    slots = eng.runner.graphs.slots                 # every finished request released its seat, none copied out
    assert all(o is None for o in slots.owner) and slots.releases > 0 and slots.evictions == 0
    assert got == _run(_engine(tiny_ckpt, NumpyOps(), False, drafts), prompts)
