"""Decode work as CUDA graphs (cuda backend, CUPYGLM_CUDA_GRAPHS=1): each main layer's FFN half (hc_pre, norm,
dense MLP or MoE, the all-reduce, hc_post) captured once per (layer, batch bucket) and replayed.

What is captured and why it stays exact:
* Only calls whose rows are all decode/verify rows, at most 16 (`bucket`): a call of R rows runs in the smallest
  bucket B >= R (1, 2, 4, 8, 16). Rows are batch-invariant (every kernel of the decode role computes a row from
  that row alone, the expert pairs sorted per expert in pair order), so the R real rows of a B-row replay are the
  bits of the same R rows run eagerly; the padding rows B-R.. hold earlier real rows (or zeros at first) and
  their outputs are dropped.
* The FFN half reads nothing that changes per step but its input rows: its grids, shapes and host branches
  depend on B alone, never on context length, page tables or sequences. The one per-step input is the graph's
  static input [B, 4, D] bf16, written in place (one copy) before each replay; the weights, the guard flags
  and everything else it reads are fixed allocations.
* The graphs' temporaries and outputs come from a private memory pool per bucket, kept alive with the graphs, so
  eager work never reuses them. A bucket's graphs share its pool (as PyTorch shares a graph pool): they replay
  one after another on one stream in capture order (layer order), so a block one graph used as a temporary and
  a later one reuses is never live in both; outputs stay allocated. A replay rewrites its output, which the
  step consumes before the same graph replays again. Device memory: per bucket B, L x [B, 4, D] bf16 outputs
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
        self.graph = graph            # cupy.cuda.Graph of block.ffn(static, B, comm)
        self.static = static          # [B, 4, D] bf16: the graph's input rows, written in place each step
        self.out = out                # [B, 4, D] bf16: its output rows (from the bucket's pool)


class FFNGraphs:
    """The captured FFN halves of one model, per (layer, bucket)."""

    def __init__(self, ops, comm):
        self.ops, self.comm, self.cp = ops, comm, ops.xp
        self.stream = self.cp.cuda.Stream(non_blocking=True)       # captures only; replays run on the current
        self.entries: dict[tuple[int, int], _Entry] = {}
        self.pools: dict[int, object] = {}                          # bucket -> its graphs' cupy.cuda.MemoryPool
        self.replays = 0

    def ffn(self, block, X):
        """X: [R, 4, D] bf16 decode/verify rows -> block.ffn(X, R, comm), by a graph replay when R fits a bucket."""
        r = X.shape[0]
        b = bucket(r)
        if b is None:
            return block.ffn(X, r, self.comm)
        e = self.entries.get((block.layer, b))
        if e is None:
            e = self.entries[(block.layer, b)] = self._capture(block, b, X)
        e.static[:r] = X                                            # the per-step input, in place
        e.graph.launch()
        self.replays += 1
        return e.out[:r]

    def _capture(self, block, b: int, X) -> _Entry:
        cp = self.cp
        static = cp.zeros((b,) + tuple(X.shape[1:]), dtype=X.dtype)   # [B, 4, D] bf16, padding rows zero at first
        static[:X.shape[0]] = X
        block.ffn(static, b, self.comm)                             # warm-up: kernels loaded, flags allocated
        pool = self.pools.get(b)
        if pool is None:
            pool = self.pools[b] = cp.cuda.MemoryPool()
        with self.stream, cp.cuda.using_allocator(pool.malloc):
            self.stream.begin_capture()
            try:
                out = block.ffn(static, b, self.comm)
            finally:
                graph = self.stream.end_capture()
        return _Entry(graph, static, out)
