"""Decode work as CUDA graphs (cuda backend, CUPYGLM_CUDA_GRAPHS=1): each main layer's FFN half (dense MLP or
MoE from the normed row, the all-reduce, hc_post fused with the next layer's hc_pre + norm) captured once per
(layer, batch bucket) and replayed.

What is captured and why it stays exact:
* Only calls whose rows are all decode/verify rows, at most 16 (`bucket`): a call of R rows runs in the smallest
  bucket B >= R (1, 2, 4, 8, 16). Rows are batch-invariant (every kernel of the decode role computes a row from
  that row alone, the expert pairs sorted per expert in pair order), so the R real rows of a B-row replay are the
  bits of the same R rows run eagerly; the padding rows B-R.. hold earlier real rows (or zeros at first) and
  their outputs are dropped.
* The FFN half reads nothing that changes per step but its input rows: its grids, shapes and host branches
  depend on B alone, never on context length, page tables or sequences. The per-step inputs are the graph's
  static (X [B, 4, D] bf16, h [B, D] bf16, post, comb), written in place (one copy each) before each replay; the weights, the guard flags
  and everything else it reads are fixed allocations.
* The graphs' temporaries and outputs come from a private memory pool per bucket, kept alive with the graphs, so
  eager work never reuses them. A bucket's graphs share its pool (as PyTorch shares a graph pool): they replay
  one after another on one stream in capture order (layer order), so a block one graph used as a temporary and
  a later one reuses is never live in both; outputs stay allocated. A replay rewrites its output, which the
  step consumes before the same graph replays again. Device memory: per bucket B, L x (X, h, post, comb) outputs
  and one layer's temporaries (not in the memory plan: it comes out of CUPYGLM_MEMORY_RESERVE_GIB).
* Capture is keyed by (layer, B) only, since nothing host-side in the FFN half depends on anything else. A
  warm-up run of the same call precedes the capture (kernels loaded, guard flags allocated: no allocation
  outside the pool, no module load inside the capture).
Eager: prompt rows, mixed calls, the attention halves (their host-side shapes follow context lengths: index
tails, visible pools, pick widths, page tables; KDA states are per-sequence arrays), embedding, lm_head, MTP.
"""
from __future__ import annotations

BUCKETS = (1, 2, 4, 8, 16)


def bucket(rows: int) -> int | None:
    """The smallest bucket holding `rows` rows, or None (eager)."""
    for b in BUCKETS:
        if rows <= b:
            return b
    return None


class _Entry:
    def __init__(self, graph, static, out):
        self.graph = graph            # cupy.cuda.Graph of block.ffn(*static, B, comm, nxt)
        self.static = static          # (X [B, 4, D] bf16, h [B, D] bf16, post, comb): the graph's inputs, written in place
        self.out = out                # (X', h', post', comb') from the bucket's pool (None entries after the last layer)


class FFNGraphs:
    """The captured FFN halves of one model, per (layer, bucket)."""

    def __init__(self, ops, comm):
        self.ops, self.comm, self.cp = ops, comm, ops.xp
        self.stream = self.cp.cuda.Stream(non_blocking=True)       # captures only; replays run on the current
        self.entries: dict[tuple[int, int], _Entry] = {}
        self.pools: dict[int, object] = {}                          # bucket -> its graphs' cupy.cuda.MemoryPool
        self.replays = 0

    def ffn(self, block, inputs: tuple, nxt):
        """inputs (X, h, post, comb) of R decode/verify rows -> block.ffn(*inputs, R, comm, nxt), by a graph
        replay when R fits a bucket."""
        r = inputs[0].shape[0]
        b = bucket(r)
        if b is None:
            return block.ffn(*inputs, r, self.comm, nxt)
        e = self.entries.get((block.layer, b))
        if e is None:
            e = self.entries[(block.layer, b)] = self._capture(block, b, inputs, nxt)
        for s, x in zip(e.static, inputs):
            s[:r] = x                                               # the per-step inputs, in place
        e.graph.launch()
        self.replays += 1
        return tuple(None if o is None else o[:r] for o in e.out)

    def _capture(self, block, b: int, inputs: tuple, nxt) -> _Entry:
        cp = self.cp
        r = inputs[0].shape[0]
        static = tuple(cp.zeros((b,) + tuple(x.shape[1:]), dtype=x.dtype) for x in inputs)   # padding rows zero at first
        for s, x in zip(static, inputs):
            s[:r] = x
        block.ffn(*static, b, self.comm, nxt)                       # warm-up: kernels loaded, flags allocated
        pool = self.pools.get(b)
        if pool is None:
            pool = self.pools[b] = cp.cuda.MemoryPool()
        with self.stream, cp.cuda.using_allocator(pool.malloc):
            self.stream.begin_capture()
            try:
                out = block.ffn(*static, b, self.comm, nxt)
            finally:
                graph = self.stream.end_capture()
        return _Entry(graph, static, out)
