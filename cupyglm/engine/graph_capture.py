"""Decode calls as CUDA graphs (cuda backend, CUPYGLM_CUDA_GRAPHS=1): per (layer, batch bucket) one graph,
captured once and replayed; a DSA layer's per maps layout (below). Every layer is captured whole (its attention
half from the normed row, the allgather, hc_post fused with hc_pre + norm, the FFN half, the allgather, hc_post
fused with the next layer's hc_pre + norm); on the host-rows path (`kv.host`) a DSA layer's FFN half alone.

What is captured and why it stays exact:
* Only calls whose rows are all decode/verify rows, at most 16 (`bucket`): a call of R rows runs in the smallest
  bucket B >= R (1, 2, 4, 8, 16). Rows are batch-invariant (every kernel of the decode role computes a row from
  that row alone, the expert pairs sorted per expert in pair order, a KDA row from its own sequence's state), so
  the R real rows of a B-row replay are the bits of the same R rows run eagerly; the padding rows B-R.. hold
  earlier real rows (or zeros at first), run KDA on a zero state that is never written back, write DSA latent rows
  to the KV store's scratch pages (model/seg_device.CallMaps padded: their own rows, position 0, their own pool
  table row, no index tail, no pooled key), and their outputs are dropped.
* A KDA graph reads nothing that changes per step but its input rows and the call's slot table: its grids, shapes
  and host branches depend on B alone. The KDA states live in slots at fixed addresses (engine/kda_slots.py states
  the ownership rule: a seated sequence's SeqState arrays are views of its slot, written in place only by its own
  calls' replays, moved in only when the batch's composition changes), stepped by one kda_step_slots launch for
  all the call's sequences, each sequence's rows in order (MTP verify rows included).
* A DSA graph reads the call's maps (latent rows, positions, page table, row segments, pool table, tail table,
  done rows) from the fixed buffer of their layout (B, table width bucket, pool-table width bucket), uploaded once
  a call and shared by its DSA layers; every host-side shape of the layer follows that layout (the pick's width
  is the model's, the tail launch's grid.y the bucket), so the key is (layer, B, layout). The index tails sit in
  fixed slots (kv/index_tails.py), made each state's views on the host before the replay. A layer's first layout
  owns its outputs; a later layout's graph copies its outputs into them (inside the graph), so the layer after it
  stays chained and its own outputs are temporaries. A DSA warm-up runs the layout's all-padding twin (scratch
  rows alone), so no sequence's rows, tails or pooled keys are written twice.
* Static inputs (X [B, 4, D] bf16, h [B, D] bf16, post, comb). Chained: when layer i's graph outputs are layer
  i+1's inputs (consecutive captured layers), layer i+1 is captured with layer i's output buffers as its static
  inputs, so nothing is copied between them; only inputs that come from eager work (the embedding, a host-rows DSA
  attention half) are written in place (one copy each) before the replay. The weights, the guard flags, the
  slots, the maps' buffers, the KV store and everything else a graph reads are fixed allocations.
* The graphs' temporaries and outputs come from a private memory pool per bucket, kept alive with the graphs, so
  eager work never reuses them. A bucket's graphs share its pool (as PyTorch shares a graph pool): they replay
  one after another on one stream, so a block one graph used as a temporary and a later one reuses is never live
  in both; outputs stay allocated. A replay rewrites its outputs, which the step (or the next graph) consumes
  before the same graph replays again. Device memory: per bucket B, L x (X, h, post, comb) outputs, one layer's
  temporaries and the DSA maps' buffers, plus the KDA slots and the store's scratch pages; the memory plan sets
  them aside before sizing pages (engine/plan_graphs.py).
* Capture is keyed by (layer, B) (and a DSA layer's layout). A warm-up run of the same work precedes the capture
  (kernels loaded, guard flags allocated: no allocation outside the pool, no module load inside the capture); a
  KDA warm-up runs every row as padding, so no slot is written.
Eager: prompt rows, mixed calls, calls over 16 rows, the host-rows path's DSA attention halves (kv.host: its
gather, and the write-hash mode), MTP, the sampling of a step with logits edits. The ends (embedding -> streams
-> layer 0's hc_pre + norm; final norm -> lm_head -> vocab gather, and a plain step's sample) are captured by
engine/graph_ends.py; engine/graph_forward.py decides per call which runs.
"""
from __future__ import annotations

from cupyglm.engine.kda_slots import KDASlots
from cupyglm.kv.copy_hooks import address_of
from cupyglm.model.seg_device import CallMaps

BUCKETS = (1, 2, 4, 8, 16)


def bucket(rows: int) -> int | None:
    """The smallest bucket holding `rows` rows, or None (eager)."""
    for b in BUCKETS:
        if rows <= b:
            return b
    return None


def graph_maps(segs, kv, xp, b: int, into: dict) -> CallMaps:
    """A captured decode call's maps padded to its bucket b, uploaded into `into`'s buffer of their layout (one
    upload), built by the first layer that asks and cached on segs[0]."""
    dev = segs[0].dev
    if "graph_maps" not in dev:
        dev["graph_maps"] = CallMaps(segs, kv, xp, pad_to=b, into=into)
    return dev["graph_maps"]


class _Entry:
    def __init__(self, graph, static, out, layout=None):
        self.graph = graph            # cupy.cuda.Graph of the layer's captured work (its first layout's)
        self.static = static          # (X [B, 4, D] bf16, h [B, D] bf16, post, comb): its inputs, fixed buffers
        self.out = out                # (X', h', post', comb') from the bucket's pool (None entries after the last layer)
        self.variants = {layout: graph}   # a DSA layer: a graph per maps layout (B, width, Pw), all writing `out`


class DecodeGraphs:
    """The captured decode work of one model, per (layer, bucket) (a DSA layer's per maps layout within)."""

    def __init__(self, ops, comm):
        self.ops, self.comm, self.cp = ops, comm, ops.xp
        self.stream = self.cp.cuda.Stream(non_blocking=True)       # captures only; replays run on the current
        self.entries: dict[tuple[int, int], _Entry] = {}
        self.pools: dict[int, object] = {}                          # bucket -> its graphs' cupy.cuda.MemoryPool
        self.slots = KDASlots(self.cp)
        self.maps: dict[tuple, object] = {}                         # layout -> the DSA maps' fixed int32 buffer
        self.replays = 0
        self.copies = 0                                             # static inputs written before a replay
        self.sources: list[tuple[int, tuple]] = []                  # (bucket, outputs): graph_ends' entry graphs

    @staticmethod
    def takes(rows: int, decode: int) -> bool:
        """Whether a call of `rows` rows, the leading `decode` of them decode/verify rows, replays graphs."""
        return decode == rows and bucket(rows) is not None

    def layer(self, block, inputs: tuple, segs, kv, nxt):
        """A whole layer of a decode call: inputs (X, h, post, comb) of its R rows -> the next layer's."""
        if not block.is_kda:
            return self._dsa(block, inputs, segs, kv, nxt)
        r = inputs[0].shape[0]
        b = bucket(r)
        layer, slots = block.layer, self.slots
        slots.seat(segs, r, b)
        slots.move_in(layer, segs)
        return self._replay(block, b, inputs,
                            lambda *st: block.whole(*st, (slots.args(layer, b),), self.comm, nxt),
                            lambda *st: block.whole(*st, (slots.args(layer, b, warm=True),), self.comm, nxt))

    def _dsa(self, block, inputs: tuple, segs, kv, nxt):
        """A whole DSA layer (device rows): the call's maps padded to the bucket in their layout's fixed buffer (one
        upload a call, shared by its DSA layers), each state's index tail as its slot's views (host, before)."""
        b = bucket(inputs[0].shape[0])
        maps = graph_maps(segs, kv, self.cp, b, self.maps)
        block.attn.tail_views(kv, segs)

        def warm(*st):                                              # the layout's all-padding twin: scratch rows alone
            twin = CallMaps([], kv, self.cp, pad_to=b, widths=maps.layout[1:])
            return block.whole(*st, (kv, twin), self.comm, nxt)
        return self._replay(block, b, inputs, lambda *st: block.whole(*st, (kv, maps), self.comm, nxt), warm,
                            maps.layout)

    def ffn(self, block, inputs: tuple, nxt):
        """A DSA layer's FFN half (its attention eager: the host-rows path): inputs (X, h, post, comb) of R
        decode/verify rows -> block.ffn(...)."""
        b = bucket(inputs[0].shape[0])
        run = lambda *st: block.ffn(*st, b, self.comm, nxt)         # noqa: E731
        return self._replay(block, b, inputs, run, run)

    def _replay(self, block, b: int, inputs: tuple, run, warm, layout=None):
        r = inputs[0].shape[0]
        e = self.entries.get((block.layer, b))
        if e is None:
            e = self.entries[(block.layer, b)] = self._capture(b, inputs, run, warm, layout)
        elif layout not in e.variants:
            e.variants[layout] = self._variant(b, e, run, warm)
        for s, x in zip(e.static, inputs):
            if address_of(s) != address_of(x):                      # chained inputs are the buffers themselves
                s[:r] = x
                self.copies += 1
        e.variants[layout].launch()
        self.replays += 1
        return tuple(None if o is None else o[:r] for o in e.out)

    def _chained(self, b: int, inputs: tuple):
        """The output buffers of a bucket-b graph that `inputs` are (the previous captured layer's), or None."""
        want = tuple(address_of(x) for x in inputs)
        outs = [e.out for (_, bb), e in self.entries.items() if bb == b] + [o for bb, o in self.sources if bb == b]
        for out in outs:                                            # layer graphs' outputs, then graph_ends' entries
            if all(o is not None for o in out) and tuple(address_of(o) for o in out) == want:
                return out
        return None

    def _capture(self, b: int, inputs: tuple, run, warm, layout) -> _Entry:
        cp = self.cp
        static = self._chained(b, inputs)
        if static is None:
            static = tuple(cp.zeros((b,) + tuple(x.shape[1:]), dtype=x.dtype) for x in inputs)   # padding rows zero at first
        warm(*static)                                               # kernels loaded, flags allocated
        graph, out = self.record(b, lambda: run(*static))
        return _Entry(graph, static, out, layout)

    def _variant(self, b: int, e: _Entry, run, warm):
        """Another layout's graph of a captured layer: the same static inputs, its outputs copied into the entry's
        (inside the graph), so the graphs chained to them read them; its own outputs are its temporaries."""
        def both():
            for dst, src in zip(e.out, run(*e.static)):
                if dst is not None:
                    dst[...] = src
        warm(*e.static)
        return self.record(b, both)[0]

    def record(self, b: int, run) -> tuple:
        """(graph, outputs) of run() captured on the capture stream, allocating from bucket b's pool (the caller
        warmed the same work up first)."""
        cp = self.cp
        pool = self.pools.get(b)
        if pool is None:
            pool = self.pools[b] = cp.cuda.MemoryPool()
        with self.stream, cp.cuda.using_allocator(pool.malloc):
            self.stream.begin_capture()
            try:
                out = run()
            finally:
                graph = self.stream.end_capture()
        return graph, out
