"""The device memory of CUDA graphs (CUPYGLM_CUDA_GRAPHS=1) as one line of the memory plan. `graph_terms` is the
one place that lists what graphs hold (a new fixed buffer of captured work is one more entry there):

    kda slots    exact: engine/kda_slots.py's seats (`memory.graph_slot_arrays`), allocated at the first capture
    graph pools  a bound, summed over the buckets B of engine/graph_capture.py (1, 2, 4, 8, 16):
                 - every captured layer's outputs (X', h', post', comb'), kept with its graph;
                 - the static inputs of the graphs fed by eager work (after the embedding, after each DSA attention
                   half of the host-rows path; chained layers read the previous graph's outputs);
                 - one layer's temporaries: a bucket's graphs share its pool, so the blocks a capture frees are
                   there for the next; an estimate from the shapes, every term at fp32 width, both halves of a
                   layer (KDA or DSA, the larger; a DSA layer's at the window's widest pool table, with a later
                   layout's outputs) with the wider FFN live at once, each array rounded up to the pool's 512-byte
                   unit;
                 - the DSA maps' fixed buffers (model/seg_device.CallMaps padded to B), one per layout (B, width,
                   Pw) a window's lengths reach (`dsa_layouts`), exactly;
                 - the KV store's scratch pages (kv/store.scratch_pages), where padding rows write, exactly;
                 - the ends (engine/graph_ends.py): the feed, the final-normed rows, the picked rows and the
                   logits, this rank's vocab slice and the gathered rows; the sample graph's scratch and tokens.
The plan sizes the KV pages after these bytes and refuses to start when they do not fit.
"""
from __future__ import annotations

from cupyglm.config import ModelConfig
from cupyglm.kv.store import scratch_pages
from cupyglm.memory import FP32, I32, ArraySpec, Storage, graph_slot_arrays, graph_stream_arrays, kv_arrays, total_bytes
from cupyglm.kernels import ops_pick
from cupyglm.kernels.ops_sample import BINS as SAMPLE_BINS, THREADS as SAMPLE_THREADS
from cupyglm.engine.graph_capture import BUCKETS
from cupyglm.engine.graph_ends import FEED_ROWS
from cupyglm.engine.kda_slots import SLOTS
from cupyglm.model.seg_device import width_bucket

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


def dsa_temporaries(cfg: ModelConfig, tp: int, b: int, pw: int) -> list[ArraySpec]:
    """An estimate of a captured DSA attention half's temporaries for b rows and a pool table Pw wide (every term
    fp32): the projections, the pool scores, the pick's lists and its parts' candidates, the heads' latent queries
    and outputs, the split attention's scratch, the value heads, and the outputs of a later layout's graph (copied
    into the first's)."""
    h, r, w = cfg.num_attention_heads // tp, cfg.kv_lora_rank, cfg.max_pick
    c, i, hi = -(-w // cfg.attn_chunk), cfg.index_head_dim, cfg.index_n_heads
    cols = ops_pick.scratch_cols(pw, cfg.index_pools)
    proj = cfg.q_lora_rank + r + 3 * i + hi + h * cfg.qk_nope_head_dim + hi * i     # qa, kva, ik, ig, hw, qb, qib
    return [ArraySpec("graphs.tmp.dsa_proj", (b, proj), FP32),
            ArraySpec("graphs.tmp.dsa_scores", (b, pw), FP32),
            ArraySpec("graphs.tmp.dsa_pick", (b, w + 1), I32),          # token lists, counts
            ArraySpec("graphs.tmp.dsa_pick_parts", (2, b, max(1, cols)), I32),   # the parts' candidate keys, pools
            ArraySpec("graphs.tmp.dsa_heads", (3, b, h, r), FP32),      # latent queries (and their copy), output
            ArraySpec("graphs.tmp.dsa_split", (b, h, w + c * (r + 2) + 1), FP32),   # scores, chunk max/sum, P.V
            ArraySpec("graphs.tmp.dsa_values", (2, b, h * cfg.v_head_dim), FP32),
            *graph_stream_arrays(cfg, b, "tmp.variant")]


def dsa_layouts(cfg: ModelConfig, page_tokens: int, window: int) -> list[tuple[int, int]]:
    """(width, Pw) of every DSA maps layout a call reaches within `window` tokens: both widths follow the longest
    sequence's length L (its pages and its visible pools), so the layouts are those of L = 1 .. window, each
    reached at L = 1 or where one of the two buckets steps up (L = 2^k pages + 1 token, or 2^k + 1 pools)."""
    kp, top = cfg.index_kpool, max(1, window)
    steps = [1] + [a for k in range(top.bit_length() + 1) for a in ((1 << k) * page_tokens + 1, ((1 << k) + 1) * kp)]
    return sorted({(width_bucket(-(-n // page_tokens)), width_bucket(n // kp)) for n in steps if n <= top})


def dsa_maps_arrays(cfg: ModelConfig, b: int, page_tokens: int, window: int) -> list[ArraySpec]:
    """The DSA maps' fixed buffers of bucket b (model/seg_device.CallMaps padded: latent, positions, row segments,
    table, pool table, done rows, tail table), one a layout."""
    return [ArraySpec(f"graphs.dsa_maps.{b}.{w}.{pw}", (b * (9 + w + pw),), I32)
            for w, pw in dsa_layouts(cfg, page_tokens, window)]


def ends_arrays(cfg: ModelConfig, tp: int, b: int) -> list[ArraySpec]:
    """The captured ends' buffers for b rows (engine/graph_ends.py), every row term at fp32 width."""
    d, v = cfg.hidden_size, cfg.vocab_size
    return [ArraySpec("graphs.ends.feed", (FEED_ROWS, b), I32),         # token ids, logits row map, sampling columns
            ArraySpec("graphs.ends.rows", (2, b, d), FP32),             # final-normed rows, picked rows
            ArraySpec("graphs.ends.logits_rank", (b, v // tp), FP32),   # this rank's lm_head slice
            ArraySpec("graphs.ends.logits", (b, v), FP32),              # gathered in rank order
            ArraySpec("graphs.ends.sample_keys", (b, 2, 2 * v), I32),   # [B, 2, V] u64 (value bits, id) keys
            ArraySpec("graphs.ends.sample_counts", (b, SAMPLE_BINS, SAMPLE_THREADS), I32),   # u32 digit counts
            ArraySpec("graphs.ends.sample_probs", (b, v), FP32),        # e, p, the draw's prefix
            ArraySpec("graphs.ends.tokens", (b,), I32)]


def graph_pool_bytes(cfg: ModelConfig, tp: int, storage: Storage, b: int, window: int = 0,
                     page_tokens: int = 0) -> int:
    """A bound on bucket b's pool, static inputs and DSA maps (see the module docstring); window: the longest
    sequence (0: the model's maximum), page_tokens (0: the model's)."""
    window, page_tokens = window or cfg.max_position_embeddings, page_tokens or cfg.page_tokens
    layers = cfg.num_hidden_layers                                     # every main layer is captured
    fed = len({0, *cfg.dsa_layers})                                    # graphs whose inputs come from eager work
    per_layer = _pooled(graph_stream_arrays(cfg, b, "out"), storage)
    statics = total_bytes(graph_stream_arrays(cfg, b, "in"), storage)
    pw = max(p for _, p in dsa_layouts(cfg, page_tokens, window))
    common = layer_temporaries(cfg, tp, b)                             # a KDA layer's, the FFN half's
    dsa = [a for a in common if a.name != "graphs.tmp.attn"] + dsa_temporaries(cfg, tp, b, pw)
    temporaries = max(_pooled(common, storage), _pooled(dsa, storage))
    maps = total_bytes(dsa_maps_arrays(cfg, b, page_tokens, window), storage)
    return (layers * per_layer + fed * statics + temporaries + _pooled(ends_arrays(cfg, tp, b), storage) + maps)


def graph_terms(cfg: ModelConfig, tp: int, storage: Storage, window: int = 0,
                page_tokens: int = 0) -> tuple[tuple[str, int, bool], ...]:
    """What graphs hold on one rank: (name, bytes, exact) per term; window: the longest sequence the plan allows
    (0: the model's maximum), page_tokens (0: the model's)."""
    pt = page_tokens or cfg.page_tokens
    scratch = total_bytes(kv_arrays(cfg, scratch_pages(pt), pt), storage)      # the padding rows' pages
    return (("kda slots", total_bytes(graph_slot_arrays(cfg, tp, SLOTS, BUCKETS), storage), True),
            ("graph pools", sum(graph_pool_bytes(cfg, tp, storage, b, window, pt) for b in BUCKETS) + scratch,
             False))


def graph_bytes(terms) -> int:
    return sum(n for _, n, _ in terms)


def describe(terms) -> str:
    """'kda slots 1.10 GiB + graph pools <= 0.09 GiB' (<= where a term is a bound)."""
    return " + ".join(f"{name} {'' if exact else '<= '}{n / (1 << 30):.2f} GiB" for name, n, exact in terms)

