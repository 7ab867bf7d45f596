"""The ends of a captured decode call (cuda backend, CUPYGLM_CUDA_GRAPHS=1): per batch bucket one graph for the
entry (embedding rows -> the 4 streams -> layer 0's hc_pre + norm) and one for the exit (final stream mean,
norm, the rows whose logits are wanted, lm_head, the rank-order vocab gather), beside engine/graph_capture.py's
layer graphs; engine/graph_forward.py runs them. Same calls as the layers (`DecodeGraphs.takes`: every row a
decode/verify row, at most 16).

What stays true:
* One host-to-device upload a call: `feed` [9, B] int32 (row 0: the token ids, row 1: the logits row map, the picked
  rows' indices in call order; rows 2-8 the sampled rows' columns in engine/draw.py's packed layout) written in place
  into a fixed buffer; padding entries hold id 0 / row 0 / zero columns (a greedy draw of a dropped row).
* The entry graph's outputs (X [B, 4, D] bf16, h [B, D] bf16, post, comb) are in the bucket's pool and are
  registered with DecodeGraphs (`sources`), so layer 0's graph, when captured, takes them as its static inputs
  (chained: nothing copied). The exit graph's input is the last layer graph's output X itself when it is one
  (chained), else a fixed buffer written in place.
* Rows are batch-invariant: the exit normalises all B rows, gathers the P picked rows through the row map into
  a B-row block (padding rows pick row 0) and runs lm_head with all B rows as decode rows, whose first P rows
  are the bits the eager path's P-row call gives; the eager path runs the very same function (GLMModel.ends_exit)
  with its own P-row map. The outputs are views [:R] / [:P] of pool buffers the next replay of the bucket
  rewrites: the step reads them before its next forward call.
* Captured in the first call of a bucket, after a warm-up run of the same work (kernels loaded, guard flags
  allocated), in the bucket's pool; the entry before layer 0's graph and the exit after the last layer's, so a
  bucket's graphs replay in capture order on one stream (the pool-sharing rule of graph_capture).
* Sampling (rank 0, a step whose every logits row is plain: `SampleRows`): a sample graph per bucket, replayed right
  after the exit graph, runs `ops.sample` on the exit's B logits rows (its output buffer, chained) with the columns
  read from the feed (uploaded with the ids and the map; engine/draw.packed, the one sampler's captured form), so the
  step's one read-back is the drawn tokens [P]. The same kernel on the same fp32 rows and the same (seed, position)
  columns as the eager sample gives the same tokens; each row's draw reads that row alone, so padding rows change
  none. A graph of its own rather than a second "exit + sample" graph: the exit graph holds the vocab gather's
  collective, and every rank must capture (and warm up) the same collectives at the same call; the sample graph has
  none, so rank 0 alone captures it whenever its first plain step comes, other ranks and steps with logits edits
  replay the exit alone, and no exit output is held twice. It replays last in the call (the pool-sharing rule holds).
Any other step samples eagerly (engine/step_sample.py through engine/draw.eager: its columns in one transfer).
"""
from __future__ import annotations

import numpy as np

from cupyglm.engine import draw
from cupyglm.engine.graph_capture import bucket
from cupyglm.kv.copy_hooks import address_of

# the feed's rows: ids, row map, then ops.sample's columns (engine/draw.py's packed rows, 8-byte aligned at 8B bytes)
FEED_ROWS = 2 + draw.COLUMN_ROWS


class _Ends:
    def __init__(self, feed):
        self.feed = feed            # [FEED_ROWS, B] int32 device: ids, row map, sampling columns (one upload a call)
        self.enter = None           # (graph, (X, h, post, comb) outputs)
        self.exit = None            # (graph, static X, (hm [B, D] bf16, logits [B, V] f32))
        self.sample = None          # (graph, tokens [B] int32): ops.sample on the exit's logits, the feed's columns


class DecodeEnds:
    """The captured ends of one model's decode calls, per bucket: enter(ids) -> layer 0's inputs,
    exit(X, rows) -> (normed rows, logits)."""

    def __init__(self, graphs, enter, exit_):
        self.graphs, self.cp = graphs, graphs.cp
        self._enter, self._exit = enter, exit_      # GLMModel.ends_enter(ids), GLMModel.ends_exit(X, rows, decode)
        self.buckets: dict[int, _Ends] = {}
        self.replays = 0
        self.sampled = 0                            # replays of a sample graph

    def upload(self, tokens: np.ndarray, pick: np.ndarray, params: list[tuple] | None = None) -> _Ends:
        """The call's token ids [R], logits row map [P] (P <= R) and, when the exit samples, the P rows' sampling
        columns, in one upload into the bucket's feed (the columns' rows only when sampled)."""
        r = tokens.size
        b = bucket(r)
        if b is None or not 0 < pick.size <= r:
            raise ValueError(f"graph ends: a call of {r} rows picking {pick.size} logits rows is not captured")
        if params is not None and len(params) != pick.size:
            raise ValueError(f"graph ends: {len(params)} rows of sampling columns for {pick.size} logits rows")
        host = np.zeros((FEED_ROWS, b), dtype=np.int32)
        host[0, :r] = tokens
        host[1, :pick.size] = pick
        if params is not None:
            draw.pack(host[2:], params)
        e = self.buckets.get(b)
        if e is None:
            e = self.buckets[b] = _Ends(self.cp.zeros((FEED_ROWS, b), dtype=np.int32))
        n = 2 if params is None else FEED_ROWS
        e.feed[:n].set(host[:n])
        return e

    def enter(self, e: _Ends, r: int) -> tuple:
        """Layer 0's inputs (X, h, post, comb) of the call's R rows, from the uploaded ids."""
        if e.enter is None:
            run = lambda: self._enter(e.feed[0])                   # noqa: E731
            e.enter = self._capture(e.feed.shape[1], run)
            self.graphs.sources.append((e.feed.shape[1], e.enter[1]))
        self._launch(e.enter[0])
        return tuple(o[:r] for o in e.enter[1])

    def exit(self, e: _Ends, X, picks: int, sample: bool = False) -> tuple:
        """(hm [R, D] bf16 final-normed rows, logits [P, V] f32 of the mapped rows, the drawn tokens [P] int32 or
        None) from the last layer's X; sample: the sample graph after the exit (the feed holds the columns)."""
        b, r = e.feed.shape[1], X.shape[0]
        if e.exit is None:
            static = self._buffer(b, X)
            if static is None:
                static = self.cp.zeros((b,) + tuple(X.shape[1:]), dtype=X.dtype)
            run = lambda: self._exit(static, e.feed[1], b)         # noqa: E731
            graph, out = self._capture(b, run)
            e.exit = (graph, static, out)
        graph, static, (hm, logits) = e.exit
        if address_of(static) != address_of(X):
            static[:r] = X
            self.graphs.copies += 1
        self._launch(graph)
        if not sample:
            return hm[:r], logits[:picks], None
        if e.sample is None:
            e.sample = self._capture(b, lambda: draw.packed(self.graphs.ops, logits, e.feed[2:]))
        self._launch(e.sample[0])
        self.sampled += 1
        return hm[:r], logits[:picks], e.sample[1][:picks]

    def _buffer(self, b: int, x):
        """The bucket-b layer graph output that `x` is a row view of, or None."""
        for (_, bb), entry in self.graphs.entries.items():
            for o in entry.out if bb == b else ():
                if o is not None and address_of(o) == address_of(x) and o.shape[1:] == x.shape[1:]:
                    return o
        return None

    def _capture(self, b: int, run):
        run()                                                       # warm-up: kernels loaded, flags allocated
        return self.graphs.record(b, run)

    def _launch(self, graph) -> None:
        graph.launch()
        self.replays += 1

