"""DSA layer: NoPE MLA with a shared latent row (keys = values), sparse over the indexer's picked tokens.

q_a, kv_a and the indexer are replicated (so the latent rows are identical on every rank); q_b and kv_b
are split by head; the output is this rank's o_proj partial (fp32).
"""
from __future__ import annotations

from cupyglm.config import ModelConfig
from cupyglm.model import seg_device
from cupyglm.model.batch import Segment, Weights, decode_rows
from cupyglm.model.indexer import Indexer


class DSALayer:
    def __init__(self, cfg: ModelConfig, w: Weights, ops, layer: int, tp: int):
        self.cfg, self.ops, self.layer = cfg, ops, layer
        self.heads = cfg.num_attention_heads // tp
        nope, v, r = cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
        xp = ops.xp
        self.q_a, self.q_a_norm = w("q_a_proj.weight"), w("q_a_layernorm.weight")
        self.q_b = w("q_b_proj.weight")                                   # [H_rank * nope, q_lora]
        self.kv_a, self.kv_a_norm = w("kv_a_proj_with_mqa.weight"), w("kv_a_layernorm.weight")
        kv_b = w("kv_b_proj.weight").reshape(self.heads, nope + v, r)      # per head: key rows, value rows
        self.w_k_t = xp.ascontiguousarray(kv_b[:, :nope, :].transpose(0, 2, 1))   # [H, R, nope]
        self.w_v = xp.ascontiguousarray(kv_b[:, nope:, :])                        # [H, V, R]
        self.o_proj = w("o_proj.weight")                                  # [D, H_rank * V]
        self.indexer = Indexer(cfg, w.sub("indexer"), ops)

    def __call__(self, x, segs: list[Segment], kv):
        """x: [T, D] bf16 (normed). Writes latent rows and pooled keys; returns the o_proj partial [T, D]."""
        maps = seg_device.call_maps(segs, kv, self.ops.xp)                     # the call's row maps, built once
        self.tail_views(kv, segs)
        return self._attend(x, kv, maps, decode_rows(segs), segs)

    def tail_views(self, kv, segs: list[Segment]) -> None:
        """Host only, before the layer runs (eager or replayed): each state's index-tail pair as its slot's views."""
        for seg in segs:
            kv.tails.of(seg.state, self.layer)

    def decode_call(self, x, kv, maps):
        """A call whose every row is a decode/verify row: x [B, D] bf16, maps the call's padded CallMaps (the
        caller's fixed buffers), the tails' views set up by the caller (tail_views); device rows only."""
        return self._attend(x, kv, maps, x.shape[0], ())

    def _attend(self, x, kv, maps, d: int, segs):
        """d: the leading decode/verify rows (the gemv); segs: the call's segments, for the KV store's per-segment
        reads and notes (empty in decode_call)."""
        ops, c, h = self.ops, self.cfg, self.heads
        xp = ops.xp
        t = x.shape[0]
        # every projection of x in one call (q_a, kv_a, the indexer's wk, gate, head weights), then those of qn
        ix = self.indexer
        qa, kva, ikr, ig, hwr = ops.gemm_multi((x,) * 5, (self.q_a, self.kv_a, ix.wk, ix.compress_gate,
                                                          ix.weights_proj), ("bf16",) * 4 + ("f32",), decode=d)
        # q_b and wq_b of rmsnorm(q_a) (for decode rows one launch: the norm in the GEMV's prologue)
        qb, qib = ops.rmsnorm_gemm_multi(qa, self.q_a_norm, c.rms_norm_eps, (self.q_b, ix.wq_b), ("bf16", "bf16"),
                                         decode=d)
        q = qb.reshape(t, h, c.qk_nope_head_dim)                                          # [T, H, nope] bf16
        store = kv.latent[self.layer]
        # the call's latent rows, RMS-normed on their way into the store, and its index keys [T, I] bf16
        # layer-normed, in one launch for every segment
        ik = ops.write_rows_rmsnorm_keys(store, maps.latent, kva, self.kv_a_norm, c.rms_norm_eps, ikr, *ix.key_norm,
                                         distinct_on_host=True)
        written = [maps.latent_of(seg) for seg in segs]                        # per segment [n] int32 store rows
        kv.note_written(ops, self.layer, segs, written)                          # a test's check mode: rows as stored
        self.indexer.write_pools(kv, self.layer, ik, ig, maps)                   # every segment, one launch
        # every row's token list in one scores and one pick launch, on the device: no read-back
        tokens, counts = ix.pick(kv, self.layer, maps, qib, hwr)   # [T, max_pick] positions, -1 padded; [T] int32
        qa = ops.gemm_heads(q.transpose(1, 0, 2), self.w_k_t, out="bf16", decode=d).transpose(1, 0, 2)  # [T, H, R]
        o = kv.attend(ops, self.layer, segs, maps, qa, tokens, counts, c.qk_nope_head_dim ** -0.5, c.attn_chunk,
                      written, decode=d)                                                            # [T, H, R]
        out = ops.gemm_heads(xp.ascontiguousarray(o.transpose(1, 0, 2)), self.w_v, out="bf16", decode=d)  # [H, T, V]
        return ops.gemm(xp.ascontiguousarray(out.transpose(1, 0, 2)).reshape(t, -1), self.o_proj, decode=d)
