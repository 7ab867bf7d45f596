"""The calls of one decode step and of one cold prefill of the whole model on one TP rank, each a Call of
bench/sass/calls.py: every projection of cupyglm.memory.weight_arrays (logical shapes from the bf16 table, stored
bytes from the format's), the attention / indexer of the DSA layers, the KDA state of the others, two
hyper-connection updates with their norm a layer (calls.hc_decode / hc_prompt, label "norms"). A prefill's prompt
GEMMs and DSA attention run on the tensor core (bench/sass/prompt_tc.py, attention_tc); its lm_head on the last row
alone. The tensors no kernel here models (the hyper-connections' gates, conv taps, biases, the embedding rows) count
their bytes at HBM bandwidth."""
from __future__ import annotations

import functools
import re

import numpy as np

from cupyglm.checkpoint.quant import layout_for
from cupyglm.memory import Storage, weight_arrays

from bench.sass import calls, hw, prompt_tc

_SCALE = re.compile(r"\.weight_scale(_inv|_2)?$")
_EXPERT = re.compile(r"\.experts\.(\d+)\.(gate|up|down)_proj\.weight$")
_PAIRED = re.compile(r"\.(gate|up)_proj\.weight$")
_HC_FN = re.compile(r"\.hc_(attn|ffn)_fn$")


@functools.lru_cache(maxsize=None)
def _tables(cfg, tp: int, fmt: str):
    """(bf16 arrays by name, stored bytes of each projection in fmt by its .weight name)."""
    storage = Storage(np.dtype(np.uint16))
    plain = {a.name: a for a in weight_arrays(cfg, tp)}
    stored: dict[str, int] = {}
    for a in weight_arrays(cfg, tp, quant=layout_for(cfg, fmt) if fmt != "bf16" else None):
        base = _SCALE.sub(".weight", a.name)
        stored[base] = stored.get(base, 0) + a.nbytes(storage)
    return plain, stored, storage


def _projection(name: str, a) -> bool:
    return name.endswith(".weight") and len(a.shape) == 2 and "embed_tokens" not in name and min(a.shape) > 1 \
        and not re.search(r"(norm|conv)", name)


def _experts(cfg, rows: int) -> tuple[float, int]:
    """(the expected distinct experts `rows` tokens touch, rows each of them gets)."""
    e, k = cfg.n_routed_experts, cfg.num_experts_per_tok
    slices = e * (1 - (1 - k / e) ** rows)
    return slices, max(1, round(rows * k / slices))


def _projections(cfg, tp: int, fmt: str, rows: int):
    """(label, form, format, N, K, stored bytes, name) of every projection, a form of "dense", "swiglu" (a gate /
    up pair, from gate's shape), "grouped" or "grouped swiglu" (the routed experts, one a layer from expert 0's
    shape); and the bytes of the tensors left to memory alone (the embedding: its `rows` rows)."""
    plain, stored, storage = _tables(cfg, tp, fmt)
    out, small = [], 0.0
    for name, a in plain.items():
        if not _projection(name, a):
            if not _HC_FN.search(name):                    # fn: the hyper-connection calls' bytes (calls.hc_*)
                small += rows * a.shape[-1] * 2 if "embed_tokens" in name else a.nbytes(storage)
            continue
        f = fmt if stored[name] != a.nbytes(storage) else "bf16"
        m = _EXPERT.search(name)
        if m:
            if m.group(1) != "0" or m.group(2) == "up":
                continue
            gate = m.group(2) == "gate"
            label, form = f"experts {m.group(2)}{'+up' if gate else ''}", "grouped swiglu" if gate else "grouped"
        else:
            paired = _PAIRED.search(name) and name.replace("gate_proj", "up_proj") in plain
            if paired and ".up_proj." in name:
                continue
            label, form = re.sub(r"^.*layers\.\d+\.", "", name).replace(".weight", ""), "swiglu" if paired else "dense"
        out.append((label, form, f, *a.shape, stored[name], name))
    return out, small


# A layer's projections that one op of the model runs together (kda.py / dsa.py gemm_multi, rmsnorm_gemm_multi,
# moe.py gemm_and_swiglu): its bf16 decode parts share one launch of the fused GEMV; so do the quantised parts of
# _Q_SHARED (gemv_q_multi.cu, each priced as its own body; gemv_q_norm.cu, priced as its loop with the norm), a
# quantised part of any other op launches alone.
_FUSED = ((re.compile(r"self_attn\.(q|k|v|f_a|g_a|b)_proj\.weight$"), "multi"),
          (re.compile(r"self_attn\.(q_a_proj|kv_a_proj_with_mqa|indexer\.wk|indexer\.weights_proj)\.weight$"), "multi"),
          (re.compile(r"self_attn\.(q_b_proj|indexer\.wq_b)\.weight$"), "multi rmsnorm"),
          (re.compile(r"mlp\.(gate|shared_experts\.gate_proj)\.weight$"), "multi swiglu"))
_Q_SHARED = ((re.compile(r"mlp\.shared_experts\.gate_proj\.weight$"), "multi swiglu"),
             (re.compile(r"self_attn\.(q_a_proj|kv_a_proj_with_mqa|indexer\.wk)\.weight$"), "multi"),
             (re.compile(r"self_attn\.(q_b_proj|indexer\.wq_b)\.weight$"), "multi rmsnorm"))
_IN_STEP = re.compile(r"self_attn\.(f_b|g_b)_proj\.weight$")       # read inside kda_step (no launch of their own)
_LAYER = re.compile(r"layers\.(\d+)\.")


def _fused(name: str, f: str) -> str | None:
    """The fused form whose launch a bf16 projection shares, or None."""
    return next((form for pat, form in _FUSED if pat.search(name)), None) if f == "bf16" else None


def _op(name: str, f: str) -> str | None:
    """The fused op whose one launch a projection's decode rows share, or None: launched alone."""
    return _fused(name, f) or next((form for pat, form in _Q_SHARED if pat.search(name)), None)


def _decode(cfg, tp: int, fmt: str, rows: int, arch: str):
    """(label, Call) of every projection as a decode GEMV, in the launches the model's ops make; and the bytes
    left to memory. Routed experts run in moe_experts' two launches (routing and the gate/up SwiGLU, then the down
    projections and the combine; bf16 or quantised), the shared expert's down in the second when stored as the
    experts or bf16; kv_b as the absorbed per-head pair (two gemm_heads launches); f_b and g_b read by kda_step."""
    projections, small = _projections(cfg, tp, fmt, rows)
    slices, per = _experts(cfg, rows)
    experts_f = next((f for _, form, f, *_ in projections if form.startswith("grouped")), None)
    out, open_ops = [], set()
    for label, form, f, n, k, st, name in projections:
        if _IN_STEP.search(name):
            small += st
            continue
        nw = 2 if form.endswith("swiglu") else 1
        if form.startswith("grouped"):
            c = calls.gemv(form, f, n, k, per, st, nw, slices, arch=arch, collective=form == "grouped" and tp > 1,
                           moe=True)
            out.append((label, c))
            continue
        if name.endswith("kv_b_proj.weight"):
            half = calls.gemv(form, f, n // 2, k, rows, st / 2, arch=arch)
            out += [(label, half), (label, half)]
            continue
        coll = tp > 1 and (name.endswith("o_proj.weight") or name.endswith("mlp.down_proj.weight"))
        fused, shared_op = _fused(name, f), _op(name, f)
        layer = _LAYER.search(name)
        key = (layer.group(1) if layer else "", shared_op)
        in_moe = "shared_experts.down_proj" in name and f in (experts_f, "bf16")   # moe_experts' down launch
        priced = fused or ("multi rmsnorm" if shared_op == "multi rmsnorm" else form)   # its prologue's norm
        out.append((label, calls.gemv(priced, f, n, k, rows, st, nw, out_bytes=4 if "lm_head" in name else 2,
                                      arch=arch, collective=coll,
                                      launched=not in_moe and (shared_op is None or key not in open_ops))))
        if shared_op is not None:
            open_ops.add(key)
    return out, small


def _prompt(cfg, tp: int, fmt: str, rows: int, arch: str):
    """(label, Call)s of every projection on the tensor core (prompt_tc): experts grouped over their routed rows,
    gate / up pairs as SwiGLU, kv_b as the absorbed per-head pair; lm_head a GEMV of the last row alone (the one
    whose logits are sampled). And the bytes left to memory."""
    projections, small = _projections(cfg, tp, fmt, rows)
    slices, _ = _experts(cfg, rows)
    out = []
    for label, form, f, n, k, st, name in projections:
        if "lm_head" in name:
            out.append((label, calls.gemv("dense", f, n, k, 1, st, out_bytes=4, arch=arch)))
            continue
        r, e = (rows * cfg.num_experts_per_tok, slices) if form.startswith("grouped") else (rows, 0.0)
        if form.endswith("swiglu"):
            got = prompt_tc.swiglu(f, r, n, k, st, e, arch)
        elif name.endswith("kv_b_proj.weight"):
            got = prompt_tc.per_head_absorb(cfg, tp, rows, arch)
        else:
            got = prompt_tc.gemm(f, r, n, k, st, experts=e, arch=arch)
        out += [(label, c) for _, c in got]
    return out, small


def prefill_need(cfg, tp: int, fmt: str, tokens: int, arch: str = "sm_90") -> tuple[float, float]:
    """(HBM bytes, FLOPs) a cold prefill of `tokens` needs on one rank, not the tiles a kernel pads to: each
    projection's stored weights once (the routed experts: min(E, tokens x top-k) of them, gate and up both), its
    rows' x and y once and 2 M N K FLOPs a matrix (experts: the routed rows; lm_head: the last row); attention's
    picked pairs (calls.attention_prompt_work); the indexer, KDA recurrence and norms as their calls; the tensors
    no kernel models."""
    projections, nbytes = _projections(cfg, tp, fmt, tokens)
    flops = 0.0
    for _, form, _, n, k, st, name in projections:
        nw = 2 if form.endswith("swiglu") else 1
        m, copies, out_bytes = tokens, 1, 2
        if form.startswith("grouped"):
            m = tokens * cfg.num_experts_per_tok
            copies = min(cfg.n_routed_experts, m)
        elif "lm_head" in name:
            m, out_bytes = 1, 4
        flops += 2.0 * m * n * k * nw
        nbytes += copies * st * nw + m * k * 2 + m * n * out_bytes
    af, ab = calls.attention_prompt_work(cfg, tp, tokens)
    rest = _kernels(cfg, tp, tokens, arch)
    return (nbytes + len(cfg.dsa_layers) * ab + sum(c.bytes for _, c in rest),
            flops + len(cfg.dsa_layers) * af + sum(c.flops for _, c in rest))


def decode_calls(cfg, tp: int, fmt: str, batch: int, context: int, arch: str = "sm_90"):
    """(label, Call) list of one decode step of `batch` rows at `context`, and the bytes left to memory."""
    out, small = _decode(cfg, tp, fmt, batch, arch)
    for _ in cfg.dsa_layers:
        out += [("attention", c) for c in calls.attention_decode(cfg, tp, batch, context, arch)]
        out.append(("indexer", calls.index_decode(cfg, batch, context, arch)))
        out += [("indexer", calls.launch_only()) for _ in range(3)]   # kv_write_rows, index_tail_pool, dsa_pick
    out += [("kda state", calls.kda_decode(cfg, tp, batch, arch)) for _ in cfg.kda_layers]
    out += [("norms", calls.launch_only()) for _ in cfg.kda_layers]     # kda_out, the gated norm before o_proj
    hc = calls.hc_decode(cfg, tp, batch, arch)                         # one sublayer's calls, twice a layer
    out += [("norms", c) for _ in range(2 * cfg.num_hidden_layers) for c in hc]
    return out, small


def _kernels(cfg, tp: int, tokens: int, arch: str):
    """A cold prefill's indexer, KDA recurrence and norms (the same kernels whatever runs the GEMMs)."""
    out = [("indexer", calls.index_prompt(cfg, tokens, arch)) for _ in cfg.dsa_layers]
    out += [("kda state", calls.kda_prompt(cfg, tp, tokens, arch)) for _ in cfg.kda_layers]
    hc = calls.hc_prompt(cfg, tp, tokens, arch)
    return out + [("norms", c) for _ in range(2 * cfg.num_hidden_layers) for c in hc]


def prefill_calls(cfg, tp: int, fmt: str, tokens: int, arch: str = "sm_90"):
    """(label, Call) list of one cold prefill of `tokens` tokens (one pass), and the bytes left to memory: the
    prompt GEMMs on the tensor core (prompt_tc), DSA attention on attention_tc."""
    out, small = _prompt(cfg, tp, fmt, tokens, arch)
    out += [("attention", calls.attention_tc_prompt(cfg, tp, tokens, arch)) for _ in cfg.dsa_layers]
    return out + _kernels(cfg, tp, tokens, arch), small


def total_us(call_list, small: float) -> tuple[float, dict[str, float]]:
    """The step's time (us): every call's prediction plus the memory-only bytes; and the time by label."""
    from bench.sass.model import bounds

    by: dict[str, float] = {}
    for label, c in call_list:
        key = "experts" if label.startswith("experts") else label if label in (
            "attention", "indexer", "kda state", "norms", "lm_head", "dequant") else "projections"
        by[key] = by.get(key, 0.0) + bounds(c)["predicted_us"]
    by["other tensors (memory)"] = small / hw.HBM_BYTES_S * 1e6
    return sum(by.values()), by
