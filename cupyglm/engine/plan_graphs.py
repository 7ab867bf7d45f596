"""The device memory of CUDA graphs (CUPYGLM_CUDA_GRAPHS=1) as one line of the memory plan. `graph_terms` is the
one place that lists what graphs hold (a new fixed buffer of captured work is one more entry there):

    kda slots    exact: model/kda_slots.py's seats (`memory.graph_slot_arrays`), allocated at the first capture
    graph pools  a bound, summed over the buckets B of model/graph_capture.py (1, 2, 4, 8, 16):
                 - every captured layer's outputs (X', h', post', comb'), kept with its graph;
                 - the static inputs of the graphs fed by eager work (after the embedding, after each DSA attention
                   half; chained layers read the previous graph's outputs);
                 - one layer's temporaries: a bucket's graphs share its pool, so the blocks a capture frees are
                   there for the next; an estimate from the shapes, every term at fp32 width, both halves of a KDA
                   layer with the wider FFN live at once, each array rounded up to the pool's 512-byte unit;
                 - the ends (model/graph_ends.py): the feed, the final-normed rows, the picked rows and the
                   logits, this rank's vocab slice and the gathered rows; the sample graph's scratch and tokens.
The plan sizes the KV pages after these bytes and refuses to start when they do not fit.
"""
from __future__ import annotations

from cupyglm.config import ModelConfig
from cupyglm.memory import FP32, I32, ArraySpec, Storage, graph_slot_arrays, graph_stream_arrays, total_bytes
from cupyglm.kernels.ops_sample import BINS as SAMPLE_BINS, THREADS as SAMPLE_THREADS
from cupyglm.model.graph_capture import BUCKETS
from cupyglm.model.graph_ends import FEED_ROWS
from cupyglm.model.kda_slots import SLOTS

POOL_UNIT = 512                  # a CuPy memory pool hands out multiples of 512 bytes


def _pooled(specs, storage: Storage) -> int:
    """Bytes the specs take from a memory pool (each rounded up to its unit)."""
    return sum(-(-s.nbytes(storage) // POOL_UNIT) * POOL_UNIT for s in specs)


def layer_temporaries(cfg: ModelConfig, tp: int, b: int) -> list[ArraySpec]:
    """An estimate of one captured layer's temporaries for b rows, from the shapes (every term fp32): the KDA
    projections, low-rank factors, gates and output, the o_proj partial and its sum, the mid-layer streams, then
    the router, the experts' and shared expert's gate/up and SwiGLU products (or the dense MLP's, if wider), the
    FFN partial and its sum, and the MoE's per-pair maps."""
    d, hk = cfg.hidden_size, cfg.kda_num_heads * cfg.kda_head_dim // tp
    k, e = cfg.num_experts_per_tok, cfg.n_routed_experts
    inter, shared = cfg.moe_intermediate_size // tp, cfg.moe_intermediate_size * cfg.n_shared_experts // tp
    moe = 3 * (k * inter + shared) + e
    ffn = max(moe, 3 * cfg.intermediate_size // tp)
    attn = 3 * hk + 2 * cfg.kda_head_dim + cfg.kda_num_heads // tp + 3 * hk
    return [ArraySpec("graphs.tmp.attn", (b, attn), FP32),              # qkv, f_a/g_a, beta, a, gate, y
            ArraySpec("graphs.tmp.attn_partial", (b, 2, d), FP32),      # o_proj partial and its all-reduce
            *graph_stream_arrays(cfg, b, "tmp.mid"),                     # X, h, post, comb between the halves
            ArraySpec("graphs.tmp.ffn", (b, ffn), FP32),                 # router logits, gate/up, SwiGLU
            ArraySpec("graphs.tmp.ffn_partial", (b, 2, d), FP32),       # FFN partial and its all-reduce
            ArraySpec("graphs.tmp.pairs", (b * k, 4), I32)]              # ids, weights, groups, positions


def ends_arrays(cfg: ModelConfig, tp: int, b: int) -> list[ArraySpec]:
    """The captured ends' buffers for b rows (model/graph_ends.py), every row term at fp32 width."""
    d, v = cfg.hidden_size, cfg.vocab_size
    return [ArraySpec("graphs.ends.feed", (FEED_ROWS, b), I32),         # token ids, logits row map, sampling columns
            ArraySpec("graphs.ends.rows", (2, b, d), FP32),             # final-normed rows, picked rows
            ArraySpec("graphs.ends.logits_rank", (b, v // tp), FP32),   # this rank's lm_head slice
            ArraySpec("graphs.ends.logits", (b, v), FP32),              # gathered in rank order
            ArraySpec("graphs.ends.sample_keys", (b, 2, 2 * v), I32),   # [B, 2, V] u64 (value bits, id) keys
            ArraySpec("graphs.ends.sample_counts", (b, SAMPLE_BINS, SAMPLE_THREADS), I32),   # u32 digit counts
            ArraySpec("graphs.ends.sample_probs", (b, v), FP32),        # e, p, the draw's prefix
            ArraySpec("graphs.ends.tokens", (b,), I32)]


def graph_pool_bytes(cfg: ModelConfig, tp: int, storage: Storage, b: int) -> int:
    """A bound on bucket b's pool and static inputs (see the module docstring)."""
    layers = cfg.num_hidden_layers                                     # every main layer is captured
    fed = len({0, *cfg.dsa_layers})                                    # graphs whose inputs come from eager work
    per_layer = _pooled(graph_stream_arrays(cfg, b, "out"), storage)
    statics = total_bytes(graph_stream_arrays(cfg, b, "in"), storage)
    return (layers * per_layer + fed * statics + _pooled(layer_temporaries(cfg, tp, b), storage)
            + _pooled(ends_arrays(cfg, tp, b), storage))


def graph_terms(cfg: ModelConfig, tp: int, storage: Storage) -> tuple[tuple[str, int, bool], ...]:
    """What graphs hold on one rank: (name, bytes, exact) per term."""
    return (("kda slots", total_bytes(graph_slot_arrays(cfg, tp, SLOTS, BUCKETS), storage), True),
            ("graph pools", sum(graph_pool_bytes(cfg, tp, storage, b) for b in BUCKETS), False))


def graph_bytes(terms) -> int:
    return sum(n for _, n, _ in terms)


def describe(terms) -> str:
    """'kda slots 1.10 GiB + graph pools <= 0.09 GiB' (<= where a term is a bound)."""
    return " + ".join(f"{name} {'' if exact else '<= '}{n / (1 << 30):.2f} GiB" for name, n, exact in terms)

