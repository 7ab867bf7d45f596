"""The GLM-5.3-Flash forward on one rank's shard: embeddings, 4 hyper-connection streams, KDA / DSA
attention, dense MLP / MoE, the final stream mean and norm, the vocab-split lm_head, and the MTP head.

Collectives are written here, where they happen: each sublayer's partial is summed across ranks in rank
order, and the lm_head's vocab slices are gathered in rank order.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from cupyglm.checkpoint.names import TEXT_PREFIX
from cupyglm.config import ModelConfig
from cupyglm.distributed.comm import summed
from cupyglm.kv.state import SeqState
from cupyglm.kv.store import KVStore
from cupyglm.model.batch import Weights, decode_rows, segments
from cupyglm.model.dsa import DSALayer
from cupyglm.model.graph_ends import DecodeEnds, SampleRows
from cupyglm.model.kda import KDALayer
from cupyglm.model.moe import MLP, MoE
from cupyglm.model.mtp import MTPLayer


@dataclasses.dataclass
class SeqInput:
    tokens: np.ndarray            # [n] int32 new tokens, at positions state.length ..
    state: SeqState
    all_logits: bool = False      # logits for every row, else only the last
    decode: bool = False          # the rows' role: decode/verify rows (sampled or drafted tokens), else a prompt chunk


@dataclasses.dataclass
class SeqOutput:
    logits: np.ndarray            # [n or 1, V] fp32
    mtp_logits: np.ndarray | None  # [n', V] fp32 for the MTP rows this call completed (mtp on)


class HyperConnection:
    def __init__(self, cfg: ModelConfig, w: Weights, ops, sub: str):
        self.cfg, self.ops = cfg, ops
        self.fn = w(f"hc_{sub}_fn")                                       # [24, 4D] bf16
        self.base, self.scale = w(f"hc_{sub}_base"), w(f"hc_{sub}_scale")  # [24], [3] fp32 (stored F32)

    def pre_norm(self, X, norm_w):
        """(rmsnorm of the collapsed streams [T, D] bf16, post, comb): hc_pre and the sublayer's norm, one op."""
        c = self.cfg
        return self.ops.hc_pre_norm(X, self.fn, self.base, self.scale, norm_w, c.rms_norm_eps, c.hc_eps,
                                    c.hc_sinkhorn_iters)

    def post_pre_norm(self, X, branch, post, comb, norm_w):
        """The previous sublayer's hc_post (branch: its all-reduced fp32 partial, post/comb: its gates), then
        this connection's pre_norm, one op -> (X', h, post', comb')."""
        c = self.cfg
        return self.ops.hc_post_pre_norm(X, branch, post, comb, self.fn, self.base, self.scale, norm_w,
                                         c.rms_norm_eps, c.hc_eps, c.hc_sinkhorn_iters)


class Block:
    """One main layer: hc_pre -> norm -> attention -> all-reduce -> hc_post, then the same for the FFN (each
    hc_post and the hc_pre + norm after it run as one op)."""

    def __init__(self, cfg: ModelConfig, w: Weights, ops, layer: int, tp: int):
        self.cfg, self.ops, self.layer = cfg, ops, layer
        self.hc_attn, self.hc_ffn = HyperConnection(cfg, w, ops, "attn"), HyperConnection(cfg, w, ops, "ffn")
        self.in_norm, self.post_norm = w("input_layernorm.weight"), w("post_attention_layernorm.weight")
        self.is_kda = cfg.layer_types[layer] == "linear_attention"
        attn = KDALayer if self.is_kda else DSALayer
        self.attn = attn(cfg, w.sub("self_attn"), ops, layer, tp)
        self.mlp = MoE(cfg, w.sub("mlp"), ops) if cfg.is_moe(layer) else MLP(w.sub("mlp"), ops, cfg.swiglu_limit)
        self.graphs = None            # model/graph_capture.DecodeGraphs: decode calls' layers replayed whole

    def enter(self, X):
        """The first layer's attention input: (h, post, comb) of the embedded streams X."""
        return self.hc_attn.pre_norm(X, self.in_norm)

    def __call__(self, X, h, post, comb, segs, kv, comm, nxt: "Block | None"):
        """X: [T, S, D] bf16 streams; h, post, comb: this layer's attention input and gates. Returns the next
        layer's (X, h, post, comb), each hc_post fused with the hc_pre + norm after it; after the last layer
        (nxt None) the final streams (X, None, None, None). hc_post rounds the fp32 sum to bf16."""
        d = decode_rows(segs)
        graphs = self.graphs if self.graphs is not None and self.graphs.takes(X.shape[0], d) else None
        if graphs is not None and (self.is_kda or kv.host is None):     # the host-rows path's attention stays eager
            return graphs.layer(self, (X, h, post, comb), segs, kv, nxt)
        partial = self.attn(h, segs) if self.is_kda else self.attn(h, segs, kv)
        X, h, post, comb = self.hc_ffn.post_pre_norm(X, summed(comm, partial), post, comb, self.post_norm)
        if graphs is not None:
            return graphs.ffn(self, (X, h, post, comb), nxt)
        return self.ffn(X, h, post, comb, d, comm, nxt)

    def whole(self, X, h, post, comb, attn_args: tuple, comm, nxt: "Block | None"):
        """A layer of a captured decode call (every row a decode/verify row): attention, all-reduce, hc_post +
        hc_pre + norm, then the FFN half. attn_args: a KDA layer's (slots,) (the sequences' states, KDALayer's
        argument), a DSA layer's (kv, maps) (the call's padded row maps, DSALayer.captured)."""
        partial = self.attn(h, None, *attn_args) if self.is_kda else self.attn.captured(h, *attn_args)
        X, h, post, comb = self.hc_ffn.post_pre_norm(X, summed(comm, partial), post, comb, self.post_norm)
        return self.ffn(X, h, post, comb, X.shape[0], comm, nxt)

    def ffn(self, X, h, post, comb, decode: int, comm, nxt: "Block | None"):
        """The FFN half from its normed input h [T, D] bf16 (the leading `decode` rows decode/verify rows): the
        MLP or MoE, the all-reduce, hc_post fused with the next layer's hc_pre + norm -> (X', h', post', comb')."""
        partial = summed(comm, self.mlp(h, decode))
        if nxt is None:
            return self.ops.hc_post(X, partial, post, comb), None, None, None
        return nxt.hc_attn.post_pre_norm(X, partial, post, comb, nxt.in_norm)


class GLMModel:
    def __init__(self, cfg: ModelConfig, shard: dict, ops, comm, kv: KVStore, mtp: bool = False):
        self.cfg, self.ops, self.comm, self.kv = cfg, ops, comm, kv
        tp = comm.size
        root = Weights(shard, ops, TEXT_PREFIX.rstrip("."))
        self.embed = root("embed_tokens.weight")                  # [V, D] replicated
        self.norm = root("norm.weight")
        self.lm_head = ops.weight(shard["lm_head.weight"])        # [V / tp, D]
        self.blocks = [Block(cfg, root.sub(f"layers.{i}"), ops, i, tp) for i in range(cfg.num_hidden_layers)]
        self.mtp = MTPLayer(cfg, root.sub(f"layers.{cfg.mtp_layer}"), ops, cfg.mtp_layer, tp) if mtp else None
        self.ends = None              # model/graph_ends.DecodeEnds: decode calls' embedding and lm_head replayed

    def use_graphs(self, graphs) -> None:
        """Replay decode calls' layers from `graphs` (model/graph_capture.py: each layer whole; a DSA layer's FFN
        half alone on the host-rows path) and their ends (model/graph_ends.py); None: eager."""
        for b in self.blocks:
            b.graphs = graphs
        self.ends = None if graphs is None else DecodeEnds(graphs, self.ends_enter, self.ends_exit)

    def new_state(self) -> SeqState:
        st = SeqState()
        for b in self.blocks:
            if b.is_kda:
                st.kda_state[b.layer], st.kda_conv[b.layer] = b.attn.new_state()
        return st

    def release(self, state: SeqState) -> None:
        """Give a finished sequence's pages and its index-tail slot back (kv/index_tails.py: no copy)."""
        self.kv.pool.release(state.pages)
        state.pages.clear()
        self.kv.tails.release(state)

    def logits(self, h, decode: int = 0):
        """Final-normed rows [R, D] -> full-vocab logits [R, V] fp32 (vocab slices gathered in rank order); the
        leading `decode` rows are decode/verify rows."""
        return self.comm.concat_last(self.ops.gemm(h, self.lm_head, decode=decode))

    def ends_enter(self, ids) -> tuple:
        """Token ids [T] int32 (device) -> layer 0's inputs (X [T, 4, D] bf16 streams, h, post, comb)."""
        x = self.ops.read_rows(self.embed, ids)                                  # [T, D] bf16
        X = self.ops.xp.repeat(x[:, None, :], self.cfg.hc_mult, axis=1)         # [T, 4, D] streams
        return (X, *self.blocks[0].enter(X))

    def ends_exit(self, X, rows, decode: int) -> tuple:
        """The last layer's streams X [T, 4, D] bf16, rows [P] (device): the rows whose logits are wanted ->
        (final-normed rows [T, D] bf16, their logits [P, V] fp32); the leading `decode` picked rows decode/verify."""
        h = self.ops.rmsnorm(self.ops.stream_mean(X), self.norm, self.cfg.rms_norm_eps)
        return h, self.logits(h[rows], decode)

    def forward(self, batch: list[SeqInput], sample: SampleRows | None = None) -> list[SeqOutput]:
        """Outputs in the batch's order; inside, the decode/verify sequences' rows go first (rows are
        batch-invariant, so the order changes no bit). `sample`: the logits rows' sampling columns (batch order),
        drawn in the captured exit when the call replays graphs (sample.tokens set; an all-decode call keeps
        the batch's order)."""
        order = sorted(range(len(batch)), key=lambda i: not batch[i].decode)      # stable: decode first
        outs = self._forward([batch[i] for i in order], sample)
        back = [None] * len(batch)
        for i, o in zip(order, outs):
            back[i] = o
        return back

    def _forward(self, batch: list[SeqInput], sample: SampleRows | None = None) -> list[SeqOutput]:
        xp = self.ops.xp
        for item in batch:
            if item.tokens.size == 0:
                raise ValueError("a sequence in the batch has no new tokens")
            self.kv.ensure(item.state.pages, item.state.length + item.tokens.size)
        segs = segments([b.state for b in batch], [b.state.length for b in batch], [b.tokens.size for b in batch],
                        [b.decode for b in batch])
        tokens = np.concatenate([b.tokens.astype(np.int32) for b in batch])
        pick = [np.arange(s.off, s.off + s.n) if b.all_logits else np.array([s.off + s.n - 1])
                for s, b in zip(segs, batch)]
        picked = np.concatenate(pick)
        ends = self.ends if self.ends is not None and self.ends.graphs.takes(tokens.size, decode_rows(segs)) else None
        if ends is not None:                                     # one upload: ids, row map, sampling columns
            feed = ends.upload(tokens, picked, None if sample is None else sample.params)
            X, h, post, comb = ends.enter(feed, tokens.size)
        else:
            X, h, post, comb = self.ends_enter(xp.asarray(tokens))
        for i, block in enumerate(self.blocks):
            nxt = self.blocks[i + 1] if i + 1 < len(self.blocks) else None
            X, h, post, comb = block(X, h, post, comb, segs, self.kv, self.comm, nxt)
        if ends is not None:
            h, logits, drawn = ends.exit(feed, X, picked.size, sample is not None)     # [T, D], [P, V], [P]
            if sample is not None:
                sample.tokens = drawn
        else:
            h, logits = self.ends_exit(X, xp.asarray(picked), sum(p.size for p, s in zip(pick, segs) if s.decode))
        mtp_logits = self._mtp(segs, tokens, h)
        for item in batch:
            item.state.length += item.tokens.size
        out, at = [], 0
        for i, p in enumerate(pick):
            out.append(SeqOutput(logits[at:at + p.size], mtp_logits[i]))
            at += p.size
        return out

    def _mtp(self, segs, tokens, h) -> list:
        if self.mtp is None:
            return [None] * len(segs)
        msegs, hrows, ids, positions = self.mtp.rows(segs, tokens, h)
        out = {}
        if msegs:
            hm = self.mtp(self.embed, hrows, self.ops.xp.asarray(ids), positions, msegs, self.kv, self.comm)
            lg = self.logits(hm, decode_rows(msegs))
            for s in msegs:
                out[id(s.state)] = lg[s.rows]
        return [out.get(id(s.state)) for s in segs]
