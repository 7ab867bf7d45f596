"""The runner's forward with CUDA graphs (cuda backend, CUPYGLM_CUDA_GRAPHS=1): per call it chooses captured or
eager, so the model's forward stays plain eager layer calls.

A call whose every row is a decode/verify row, at most 16 (`DecodeGraphs.takes`), runs its ends through
engine/graph_ends.py and its layers through engine/graph_capture.py: each layer whole, except a DSA layer on the
host-rows path (`kv.host`), whose attention half runs eagerly (its gather and write-hash reads stay outside any
graph) and its FFN half replays. Any other call is GLMModel.forward's eager work, op for op. Both run the same
model functions in the same order on the same rows (GLMModel.begin, the layers, GLMModel.finish), so a call's bits
do not depend on the choice (engine/graph_capture.py states why a replay is exact).
"""
from __future__ import annotations

from cupyglm.engine.graph_capture import DecodeGraphs
from cupyglm.engine.graph_ends import DecodeEnds


class GraphForward:
    def __init__(self, model, ops, comm):
        self.model = model
        self.graphs = DecodeGraphs(ops, comm)       # the layers' graphs, the KDA slots (graphs.slots)
        self.ends = DecodeEnds(self.graphs, model.ends_enter, model.ends_exit)

    def forward(self, batch: list, sample=None) -> list:
        """GLMModel.forward's outputs; sample: rank 0's engine/draw.SampleRows, its tokens drawn in the captured exit
        when the call replays (left None otherwise: the caller samples eagerly)."""
        m = self.model
        call = m.begin(batch)
        if not self.graphs.takes(call.tokens.size, call.decode):
            return m.forward_call(call)
        feed = self.ends.upload(call.tokens, call.picked, None if sample is None else sample.params)  # one upload
        X, h, post, comb = self.ends.enter(feed, call.tokens.size)
        for block, nxt in m.layers():
            if block.is_kda or m.kv.host is None:
                X, h, post, comb = self.graphs.layer(block, (X, h, post, comb), call.segs, m.kv, nxt)
            else:                                  # the host-rows path's attention half stays eager
                inputs = block.attention(X, h, post, comb, call.segs, m.kv, m.comm)
                X, h, post, comb = self.graphs.ffn(block, inputs, nxt)
        h, logits, drawn = self.ends.exit(feed, X, call.picked.size, sample is not None)     # [T, D], [P, V], [P]
        if sample is not None:
            sample.tokens = drawn
        return m.finish(call, h, logits)
