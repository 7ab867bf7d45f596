"""The GLM-5.3-Flash forward on one rank's shard: embeddings, 4 hyper-connection streams, KDA / DSA
attention, dense MLP / MoE, the final stream mean and norm, the vocab-split lm_head, and the MTP head.

Collectives are written here, where they happen: each sublayer's partial is gathered from every rank (one
allgather; hc_post adds the ranks' parts in rank order as it reads them), and the lm_head's vocab slices are
gathered in rank order. `forward` is plain eager layer calls; its parts (begin, ends_enter, the layers, ends_exit,
finish) are what a runner that replays some of them runs, in the same order; the model draws no token.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from cupyglm.checkpoint.names import TEXT_PREFIX
from cupyglm.config import ModelConfig
from cupyglm.distributed.comm import gathered
from cupyglm.kv.state import SeqState
from cupyglm.kv.store import KVStore
from cupyglm.model.batch import Segment, Weights, decode_rows, segments
from cupyglm.model.dsa import DSALayer
from cupyglm.model.kda import KDALayer
from cupyglm.model.moe import MLP, MoE
from cupyglm.model.mtp import MTPLayer


@dataclasses.dataclass
class SeqInput:
    tokens: np.ndarray            # [n] int32 new tokens, at positions state.length ..
    state: SeqState
    all_logits: bool = False      # logits for every row, else only the last
    decode: bool = False          # the rows' role: decode/verify rows (sampled or drafted tokens), else a prompt chunk
    embeds: tuple = ()            # ((offset in tokens, bf16 rows [n, D]), ...): image rows replacing those embeddings


@dataclasses.dataclass
class Call:
    """One forward call's host side (GLMModel.begin), its sequences decode first."""
    items: list                   # the SeqInputs in the call's order
    order: list[int]              # items[j] is the batch's order[j]
    segs: list[Segment]
    tokens: np.ndarray            # [T] int32 the call's token ids
    pick: list[np.ndarray]        # per segment the call rows whose logits are wanted
    picked: np.ndarray            # [P] their concatenation
    decode: int                   # the leading decode/verify rows of the call
    picked_decode: int            # the leading decode/verify rows of the picked rows
    embeds: list = dataclasses.field(default_factory=list)   # (call row, bf16 rows) replacing embeddings there


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
        """The previous sublayer's hc_post (branch: its fp32 partial, or every rank's [R, T, D] as gathered, summed in
        rank order by the op; post/comb: its gates), then this connection's pre_norm, one op -> (X', h, post', comb')."""
        c = self.cfg
        return self.ops.hc_post_pre_norm(X, branch, post, comb, self.fn, self.base, self.scale, norm_w,
                                         c.rms_norm_eps, c.hc_eps, c.hc_sinkhorn_iters)


class Block:
    """One main layer: hc_pre -> norm -> attention -> allgather -> hc_post (the rank-order sum), then the same for
    the FFN (each hc_post and the hc_pre + norm after it run as one op)."""

    def __init__(self, cfg: ModelConfig, w: Weights, ops, layer: int, tp: int):
        self.cfg, self.ops, self.layer = cfg, ops, layer
        self.hc_attn, self.hc_ffn = HyperConnection(cfg, w, ops, "attn"), HyperConnection(cfg, w, ops, "ffn")
        self.in_norm, self.post_norm = w("input_layernorm.weight"), w("post_attention_layernorm.weight")
        self.is_kda = cfg.layer_types[layer] == "linear_attention"
        attn = KDALayer if self.is_kda else DSALayer
        self.attn = attn(cfg, w.sub("self_attn"), ops, layer, tp)
        self.mlp = MoE(cfg, w.sub("mlp"), ops) if cfg.is_moe(layer) else MLP(w.sub("mlp"), ops, cfg.swiglu_limit)

    def enter(self, X):
        """The first layer's attention input: (h, post, comb) of the embedded streams X."""
        return self.hc_attn.pre_norm(X, self.in_norm)

    def __call__(self, X, h, post, comb, segs, kv, comm, nxt: "Block | None"):
        """X: [T, S, D] bf16 streams; h, post, comb: this layer's attention input and gates. Returns the next
        layer's (X, h, post, comb), each hc_post fused with the hc_pre + norm after it; after the last layer
        (nxt None) the final streams (X, None, None, None). hc_post sums the ranks' fp32 partials in rank order and
        rounds the sum to bf16."""
        return self.ffn(*self.attention(X, h, post, comb, segs, kv, comm), decode_rows(segs), comm, nxt)

    def attention(self, X, h, post, comb, segs, kv, comm) -> tuple:
        """The attention half: attention, allgather, hc_post (the rank-order sum) fused with the FFN's hc_pre + norm
        -> (X', h', post', comb'), the FFN half's inputs."""
        partial = self.attn(h, segs) if self.is_kda else self.attn(h, segs, kv)
        return self.hc_ffn.post_pre_norm(X, gathered(comm, partial), post, comb, self.post_norm)

    def whole(self, X, h, post, comb, attn_args: tuple, comm, nxt: "Block | None"):
        """A layer of a call whose every row is a decode/verify row, its states and row maps in the caller's fixed
        buffers: attention, allgather, hc_post + hc_pre + norm, then the FFN half. attn_args: a KDA layer's
        (slots,) (KDALayer's argument), a DSA layer's (kv, maps) (padded row maps, DSALayer.decode_call)."""
        partial = self.attn(h, None, *attn_args) if self.is_kda else self.attn.decode_call(h, *attn_args)
        X, h, post, comb = self.hc_ffn.post_pre_norm(X, gathered(comm, partial), post, comb, self.post_norm)
        return self.ffn(X, h, post, comb, X.shape[0], comm, nxt)

    def ffn(self, X, h, post, comb, decode: int, comm, nxt: "Block | None"):
        """The FFN half from its normed input h [T, D] bf16 (the leading `decode` rows decode/verify rows): the
        MLP or MoE, the allgather, hc_post (the rank-order sum) fused with the next layer's hc_pre + norm
        -> (X', h', post', comb')."""
        partial = gathered(comm, self.mlp(h, decode))
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

    def ends_enter(self, ids, embeds=()) -> tuple:
        """Token ids [T] int32 (device) -> layer 0's inputs (X [T, 4, D] bf16 streams, h, post, comb); `embeds`:
        (row, bf16 rows [n, D]) written over the token embeddings from that row (an image's placeholders)."""
        x = self.ops.read_rows(self.embed, ids)                                  # [T, D] bf16
        for at, rows in embeds:
            x[at:at + rows.shape[0]] = self.ops.weight(rows)
        X = self.ops.xp.repeat(x[:, None, :], self.cfg.hc_mult, axis=1)         # [T, 4, D] streams
        return (X, *self.blocks[0].enter(X))

    def ends_exit(self, X, rows, decode: int) -> tuple:
        """The last layer's streams X [T, 4, D] bf16, rows [P] (device): the rows whose logits are wanted ->
        (final-normed rows [T, D] bf16, their logits [P, V] fp32); the leading `decode` picked rows decode/verify."""
        h = self.ops.rmsnorm(self.ops.stream_mean(X), self.norm, self.cfg.rms_norm_eps)
        return h, self.logits(h[rows], decode)

    def layers(self):
        """(block, the block after it or None) in order: what a layer call takes as `nxt`."""
        return zip(self.blocks, self.blocks[1:] + [None])

    def forward(self, batch: list[SeqInput]) -> list[SeqOutput]:
        """Outputs in the batch's order; inside, the decode/verify sequences' rows go first (rows are
        batch-invariant, so the order changes no bit)."""
        return self.forward_call(self.begin(batch))

    def forward_call(self, call: Call) -> list[SeqOutput]:
        """The layers of a begun call, eagerly, from its embedding to its outputs."""
        X, h, post, comb = self.ends_enter(self.ops.xp.asarray(call.tokens), call.embeds)
        for block, nxt in self.layers():
            X, h, post, comb = block(X, h, post, comb, call.segs, self.kv, self.comm, nxt)
        h, logits = self.ends_exit(X, self.ops.xp.asarray(call.picked), call.picked_decode)
        return self.finish(call, h, logits)

    def begin(self, batch: list[SeqInput]) -> Call:
        """A call's host side before any layer runs: decode sequences first, pages leased for the new rows, the
        segments, the token ids and the rows whose logits are wanted."""
        order = sorted(range(len(batch)), key=lambda i: not batch[i].decode)      # stable: decode first
        items = [batch[i] for i in order]
        for item in items:
            if item.tokens.size == 0:
                raise ValueError("a sequence in the batch has no new tokens")
            self.kv.ensure(item.state.pages, item.state.length + item.tokens.size)
        segs = segments([b.state for b in items], [b.state.length for b in items], [b.tokens.size for b in items],
                        [b.decode for b in items])
        tokens = np.concatenate([b.tokens.astype(np.int32) for b in items])
        pick = [np.arange(s.off, s.off + s.n) if b.all_logits else np.array([s.off + s.n - 1])
                for s, b in zip(segs, items)]
        embeds = [(s.off + at, rows) for s, b in zip(segs, items) for at, rows in b.embeds]
        return Call(items, order, segs, tokens, pick, np.concatenate(pick), decode_rows(segs),
                    sum(p.size for p, s in zip(pick, segs) if s.decode), embeds)

    def finish(self, call: Call, h, logits) -> list[SeqOutput]:
        """After the exit (h [T, D] final-normed rows, logits [P, V] of the picked rows): the MTP head, the states'
        lengths, and the outputs in the batch's order."""
        mtp_logits = self._mtp(call.segs, call.tokens, h)
        for item in call.items:
            item.state.length += item.tokens.size
        out, at = [], 0
        for i, p in enumerate(call.pick):
            out.append(SeqOutput(logits[at:at + p.size], mtp_logits[i]))
            at += p.size
        back = [None] * len(out)
        for i, o in zip(call.order, out):
            back[i] = o
        return back

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
