"""DSA layers captured whole in decode calls (engine/graph_capture.py), through the CuPy double:

* replay = eager, bit for bit, as the longest sequence's context crosses a table-width bucket, a pool-table-width
  bucket and the sparse limit (tiny: position 35), with sequences joining and leaving, verify rows and padded
  buckets (3 rows in the 4-row bucket: the eager rows are unpadded); a layer's graph per maps layout, chained;
* padding rows write no sequence's latent rows, pooled keys or index tails: the KV store's held pages and the
  tails equal the eager run's, byte for byte;
* a decode call runs no DSA kernel from the host (each DSA layer one replay), which the FFN-half capture did;
* CallMaps padded to a bucket: the real rows' entries are the unpadded maps', the padding rows' latent rows are
  distinct scratch rows, the padding segments have no rows, and a layout's buffer is written in place, one upload.
"""
from __future__ import annotations

import numpy as np

import cupy_double
from cupy_double.fixtures import cuda_double_module, cuda_ops, graph_runner as _runner  # noqa: F401
from cupyglm.distributed.comm import LocalComm
from cupyglm.engine.runner import ModelRunner
from cupyglm.kv.copy_hooks import address_of
from cupyglm.model.batch import segments
from cupyglm.model.glm import SeqInput
from cupyglm.model.seg_device import CallMaps
from model_helpers import bits

DSA_KERNELS = ("kv_write_rows_rmsnorm_keys", "index_tail_pool", "index_scores_rows", "dsa_pick",
               "attention_chunk_scores", "attention_chunk_pv")


def _call(runner, ops, items, decode: bool) -> list[np.ndarray]:
    out = runner.forward([SeqInput(t, s, all_logits=True, decode=decode) for s, t in items])
    return [ops.asnumpy(o.logits) for o in out]


def _held_bytes(runner, ops, states) -> dict:
    """Every KV layer's latent rows and pooled keys of the states' pages, and their index tails, on the host."""
    kv, pt, kp = runner.kv, runner.kv.page_tokens, runner.cfg.index_kpool
    rows = np.concatenate([np.arange(p * pt, (p + 1) * pt) for s in states for p in s.pages])
    pools = np.concatenate([np.arange(p * pt // kp, (p + 1) * pt // kp) for s in states for p in s.pages])
    slots = [s.tail_slot for s in states]
    out = {}
    for layer in runner.cfg.dsa_layers:
        out[("latent", layer)] = ops.asnumpy(kv.latent[layer][rows]).view(np.uint16)
        out[("pooled", layer)] = ops.asnumpy(kv.pooled[layer][pools]).view(np.uint16)
        out[("tails", layer)] = ops.asnumpy(kv.tails.ik[layer][slots]).view(np.uint16)
    return out


def test_dsa_replay_equals_eager_across_table_buckets_and_the_sparse_limit(tiny_ckpt, cuda_ops):
    cfg = tiny_ckpt.config
    eager, graph = _runner(tiny_ckpt, cuda_ops, False), _runner(tiny_ckpt, cuda_ops, True)
    prompts = [list(range(40, 70)), [5, 17, 300], [7] * 9]             # A: 30 tokens (1 page, 7 pools seen)
    es, gs = [eager.new_state() for _ in prompts], [graph.new_state() for _ in prompts]
    for run, st in ((eager, es), (graph, gs)):
        _call(run, cuda_ops, [(s, np.asarray(p, np.int32)) for s, p in zip(st[:2], prompts)], False)
    rng = np.random.default_rng(17)
    live = [0, 1]
    for step in range(17):
        if step == 4:                                                   # C joins (its prompt alone, eager)
            for run, st in ((eager, es), (graph, gs)):
                _call(run, cuda_ops, [(st[2], np.asarray(prompts[2], np.int32))], False)
            live.append(2)
        if step == 13:                                                  # B leaves
            eager.release(es[1])
            graph.release(gs[1])
            live.remove(1)
        rows = {i: (4 if i == 0 and step % 2 else 1) for i in live}     # A's verify rows every other step
        feed = {i: rng.integers(0, 400, n).astype(np.int32) for i, n in rows.items()}
        want = _call(eager, cuda_ops, [(es[i], feed[i]) for i in live], True)
        got = _call(graph, cuda_ops, [(gs[i], feed[i]) for i in live], True)
        for i, w, g in zip(live, want, got):
            assert np.isfinite(g).all(), f"step {step} seq {i}: non-finite logits"
            assert np.array_equal(bits(w), bits(g)), f"step {step} seq {i}: max diff {np.abs(w - g).max()}"
    assert es[0].length == gs[0].length > 68              # from 30: past the sparse limit (35), 4 pages, 16 pools
    dsa = [e for (layer, _), e in graph.graphs.entries.items() if layer in cfg.dsa_layers]
    seen = {lay for e in dsa for lay in e.variants}
    widths, pws = {w for _, w, _ in seen}, {p for _, _, p in seen}
    assert {2, 4, 8} <= widths and {8, 16, 32} <= pws, seen             # both buckets crossed, a graph per layout
    assert {b for b, _, _ in seen} >= {4, 8}                           # 3 rows padded to 4, verify rows to 8
    held = [es[i] for i in live], [gs[i] for i in live]
    a, b = _held_bytes(eager, cuda_ops, held[0]), _held_bytes(graph, cuda_ops, held[1])
    for key in a:                                                       # padding rows wrote no real row or tail
        assert np.array_equal(a[key], b[key]), f"{key}: the graphs' store differs from eager"
    entries = graph.graphs.entries
    for layer in cfg.dsa_layers:                                        # the layer after stays chained
        for (lay, bb), e in entries.items():
            if lay == layer + 1:
                assert e.static is entries[(layer, bb)].out


def test_a_decode_call_runs_no_dsa_kernel_from_the_host(tiny_ckpt, cuda_ops):
    runner = _runner(tiny_ckpt, cuda_ops, True)
    states = [runner.new_state() for _ in range(3)]
    out = _call(runner, cuda_ops, [(s, np.asarray([3, 1, 4, 1, 5][:i + 2], np.int32)) for i, s in enumerate(states)],
                False)
    toks = [np.array([int(np.argmax(o[-1]))], np.int32) for o in out]
    _call(runner, cuda_ops, list(zip(states, toks)), True)                      # captures
    replays, copies = runner.graphs.replays, runner.graphs.copies
    with cupy_double.counting(trace=True) as c:
        _call(runner, cuda_ops, list(zip(states, toks)), True)
    layers = tiny_ckpt.config.num_hidden_layers
    assert runner.graphs.replays - replays == layers                             # every layer one replay
    eager = {k for k, n in c.where.get("launches", {}).items() if n}
    assert not eager & set(DSA_KERNELS), f"DSA kernels launched from the host: {sorted(eager & set(DSA_KERNELS))}"
    inside = {k: c.where.get("graph_kernels", {}).get(k, 0) for k in DSA_KERNELS}
    assert inside == {k: len(tiny_ckpt.config.dsa_layers) for k in DSA_KERNELS}, inside   # each once a DSA layer
    assert c.graph_launches == layers + 2 and runner.graphs.copies == copies       # chained: no input copied


def test_padded_maps_keep_the_real_rows_and_write_in_place(tiny_ckpt, cuda_ops):
    runner = _runner(tiny_ckpt, cuda_ops, True)
    kv, xp = runner.kv, cuda_ops.xp
    states = [runner.new_state() for _ in range(2)]
    for s, n in zip(states, (37, 6)):
        kv.ensure(s.pages, n + 2)
    segs = segments(states, [37, 6], [2, 1], [True, True])
    plain = CallMaps(segs, kv, xp)
    into: dict = {}
    padded = CallMaps(segs, kv, xp, pad_to=8, into=into)
    assert padded.layout == (8, plain.table.shape[1], plain.pool_table.shape[1]) and list(into) == [padded.layout]
    h = cuda_ops.asnumpy
    for name in ("latent", "positions", "seg"):                        # per row
        assert np.array_equal(h(getattr(padded, name))[:3], h(getattr(plain, name))), name
    for name in ("table", "pool_table"):                                # per segment
        assert np.array_equal(h(getattr(padded, name))[:2], h(getattr(plain, name))), name
    assert np.array_equal(h(padded.tail_seg)[:2], h(plain.tail_seg))
    assert np.array_equal(h(padded.done_rows)[:plain.done_rows.shape[0]], h(plain.done_rows))
    pad = h(padded.latent)[3:]
    scratch = kv.rows(kv.scratch, np.arange(5))
    assert np.array_equal(pad, scratch) and np.unique(pad).size == 5       # distinct scratch rows, no real page
    assert (h(padded.positions)[3:] == 0).all() and (h(padded.tail_seg)[2:, 1] == 0).all()
    assert sorted(h(padded.seg)[3:]) == [2, 3, 4, 5, 6]               # their own (scratch) table rows
    assert padded.tail_items == 8 and padded.done_rows.shape == (8,)
    assert into[padded.layout].size == 8 * (9 + padded.layout[1] + padded.layout[2])   # plan_graphs.dsa_maps_arrays
    buf = into[padded.layout]
    for s in states:
        kv.ensure(s.pages, s.length + 3)
    with cupy_double.counting() as c:
        again = CallMaps(segments(states, [38, 7], [1, 1], [True, True]), kv, xp, pad_to=8, into=into)
    assert again.layout == padded.layout and c.h2d == 1 and c.allocs == 0
    assert address_of(again.latent) == address_of(buf)                     # the same fixed buffer, in place


def test_the_host_rows_path_keeps_dsa_attention_eager(tiny_ckpt, cuda_ops):
    """kv.host (latent rows in host memory): a DSA layer's attention half runs eagerly (its gather), its FFN half
    replays; the KV store has no scratch pages; the rows equal the eager device run's."""
    eager = _runner(tiny_ckpt, cuda_ops, False)
    host = ModelRunner(tiny_ckpt, cuda_ops, LocalComm(), 64, 16, poison=True, host_slots=64, graphs=True)
    assert host.kv.scratch == []
    es, hs = [eager.new_state() for _ in range(3)], [host.new_state() for _ in range(3)]
    for run, st in ((eager, es), (host, hs)):
        _call(run, cuda_ops, [(s, np.arange(7 + 9 * i, 40, dtype=np.int32)) for i, s in enumerate(st)], False)
    rng = np.random.default_rng(2)
    for step in range(3):
        feed = [rng.integers(0, 400, 1).astype(np.int32) for _ in es]
        want = _call(eager, cuda_ops, list(zip(es, feed)), True)
        with cupy_double.counting(trace=True) as c:
            got = _call(host, cuda_ops, list(zip(hs, feed)), True)
        for i, (w, g) in enumerate(zip(want, got)):
            assert np.array_equal(bits(w), bits(g)), f"step {step} seq {i}: max diff {np.abs(w - g).max()}"
        assert c.where["launches"]["dsa_pick"] == len(tiny_ckpt.config.dsa_layers)
    assert all(len(e.variants) == 1 for e in host.graphs.entries.values())
