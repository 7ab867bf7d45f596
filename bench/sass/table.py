"""One row per modelled kernel and shape at the model's shapes: every decode GEMV form at each row count, the
prompt GEMMs on the tensor core at M rows (gemm_tc.cu, gemm_tc_q.cu: dense and grouped), attention / indexer /
KDA / norm / hyper-connection on both paths (bench/sass_model.py prints them)."""
from __future__ import annotations

from bench.sass import calls, hw, kernels as K
from bench.sass.model import Call, bounds
from bench.sass.step import _experts, _tables


def _shape(plain, stored, storage, suffix: str):
    """(N, K, stored bytes, the format's bytes differ from bf16) of the first projection whose name ends so, a
    quantised one where there is one."""
    names = [n for n in plain if n.endswith(suffix)]
    name = next((n for n in names if stored[n] != plain[n].nbytes(storage)), names[0])
    a = plain[name]
    return a.shape[0], a.shape[1], stored[name], stored[name] != a.nbytes(storage)


def row(kernel_call: Call, rows: int, form: str, shape: str) -> dict:
    a = kernel_call.analysis
    c = a.counts
    b = bounds(kernel_call)
    peak = 100.0 * kernel_call.flops / (b["predicted_us"] * 1e-6) / hw.TENSOR_BF16_FLOPS
    return {"kernel": a.kernel.name, "role": a.kernel.role, "rows": rows, "dtype": a.kernel.dtype, "form": form,
            "shape": shape, "unit": a.kernel.unit, "instr_per_unit": a.instr_per_unit,
            "tensor_instr_per_unit": a.per_unit(c.tensor), "fp_per_unit": a.per_unit(c.fp),
            "shared_loads_per_unit": a.per_unit(c.shared_loads),
            "global_loads_per_unit": a.per_unit(c.global_loads), "loop_instr": c.instr,
            "loop_predicated": c.predicated, "registers": a.registers, "shared_bytes": a.shared + a.kernel.dyn_shared,
            "blocks_per_sm": a.blocks_per_sm, "blocks": kernel_call.blocks, **b, "tensor_peak_pct": peak}


def _gemv_rows(cfg, tp, fmt, rows, arch):
    plain, stored, storage = _tables(cfg, tp, fmt)
    dense = _shape(plain, stored, storage, "self_attn.o_proj.weight")
    shared_gate = _shape(plain, stored, storage, "shared_experts.gate_proj.weight")
    eg = _shape(plain, stored, storage, "experts.0.gate_proj.weight")
    ed = _shape(plain, stored, storage, "experts.0.down_proj.weight")
    slices, per = _experts(cfg, rows)
    out = []
    for form, (n, k, st, q), kw in (("dense", dense, {}), ("swiglu", shared_gate, {"nw": 2}),
                                     ("grouped", ed, {"slices": slices}),
                                     ("grouped swiglu", eg, {"nw": 2, "slices": slices})):
        f = fmt if q or fmt == "bf16" else None
        if f is None:
            continue
        r = per if form.startswith("grouped") else rows
        c = calls.gemv(form, f, n, k, r, st, arch=arch, **kw)
        out.append(row(c, rows, form, f"N {n} K {k}" + (f" x {slices:.0f} experts" if "slices" in kw else "")))
    if fmt == "bf16":
        h, r_, d = cfg.num_attention_heads // tp, cfg.kv_lora_rank, cfg.qk_nope_head_dim
        out.append(row(calls.gemv("dense", "bf16", r_, d, rows, r_ * d * 2, heads=h, arch=arch), rows, "per-head",
                       f"{h} heads N {r_} K {d}"))
        q = _shape(plain, stored, storage, "self_attn.q_proj.weight")
        out.append(row(calls.gemv("multi", "bf16", 3 * q[0], q[1], rows, 3 * q[2], arch=arch), rows, "multi",
                       f"q,k,v N 3x{q[0]} K {q[1]}"))
        g = _shape(plain, stored, storage, "mlp.gate_proj.weight")
        out.append(row(calls.gemv("multi swiglu", "bf16", g[0], g[1], rows, g[2], nw=2, arch=arch), rows,
                       "multi swiglu", f"N {g[0]} K {g[1]}"))
        qa = _shape(plain, stored, storage, "self_attn.q_a_proj.weight")
        kva = _shape(plain, stored, storage, "self_attn.kv_a_proj_with_mqa.weight")
        out.append(row(calls.gemv("multi rmsnorm", "bf16", qa[0] + kva[0], qa[1], rows, qa[2] + kva[2], arch=arch),
                       rows, "multi rmsnorm", f"q_a+kv_a N {qa[0] + kva[0]} K {qa[1]}"))
    else:                                    # a quantised q_b behind the q_a norm (gemv_q_norm.cu)
        n, k, st, q = _shape(plain, stored, storage, "self_attn.q_b_proj.weight")
        if q:
            out.append(row(calls.gemv("multi rmsnorm", fmt, n, k, rows, st, arch=arch), rows, "multi rmsnorm",
                           f"q_b N {n} K {k}"))
    return out


def _gemm_rows(cfg, tp, fmt, m, arch):
    """The prompt GEMMs on the tensor core at M rows: dense (o_proj) and grouped (the experts' down_proj over
    min(E, M) experts), gemm_tc for bf16 weights, gemm_tc_q for a format's quantised ones."""
    plain, stored, storage = _tables(cfg, tp, fmt)
    e = min(cfg.n_routed_experts, m)
    out = []
    n, k, st, q = _shape(plain, stored, storage, "self_attn.o_proj.weight")
    if fmt == "bf16":
        out.append(row(calls.gemm_tc(m, n, k, st, arch), m, "dense", f"M {m} N {n} K {k}"))
    elif q:
        out.append(row(calls.gemm_tc_q(fmt, m, n, k, st, arch), m, "dense", f"M {m} N {n} K {k}"))
    n, k, st, q = _shape(plain, stored, storage, "experts.0.down_proj.weight")
    shape = f"M {m} N {n} K {k} x {e} experts"
    if fmt == "bf16":
        out.append(row(calls.gemm_tc_grouped(m, n, k, st, e, arch), m, "grouped", shape))
    elif q:
        out.append(row(calls.gemm_tc_q(fmt, m, n, k, st, arch, slices=e), m, "grouped", shape))
    return out


def gemm_rows(m: int, n: int, k: int, arch: str = "sm_90") -> list[dict]:
    """The dense bf16 prompt GEMM at one shape, on the tensor core (gemm_tc.cu)."""
    return [row(calls.gemm_tc(m, n, k, 2.0 * n * k, arch), m, "dense", f"M {m} N {n} K {k}")]


def kernel_rows(cfg, tp: int, rows=(1, 16), m: int = 2048, context: int = 4096, arch: str = "sm_90") -> list[dict]:
    """Every modelled kernel at the model's shapes on one TP rank (see the module docstring)."""
    out = []
    for fmt in K.FORMATS:
        for r in rows:
            out += _gemv_rows(cfg, tp, fmt, r, arch)
        out += _gemm_rows(cfg, tp, fmt, m, arch)
    for r in rows:
        for c in calls.attention_decode(cfg, tp, r, context, arch):
            out.append(row(c, r, "attention", f"context {context}"))
        out.append(row(calls.index_decode(cfg, r, context, arch), r, "indexer", f"context {context}"))
        out.append(row(calls.kda_decode(cfg, tp, r, arch), r, "kda", "state"))
        out.append(row(calls.norm(cfg, r, arch), r, "norm", f"D {cfg.hidden_size}"))
        hc = f"D {cfg.hidden_size} x {cfg.hc_mult} streams"
        out += [row(c, r, "hc", hc) for c in calls.hc_decode(cfg, tp, r, arch) if c.analysis]
    out.append(row(calls.attention_prompt(cfg, tp, m, arch), m, "attention", f"prompt {m}"))
    out.append(row(calls.attention_tc_prompt(cfg, tp, m, arch), m, "attention tc", f"prompt {m}"))
    out.append(row(calls.index_prompt(cfg, m, arch), m, "indexer", f"prompt {m}"))
    out.append(row(calls.kda_prompt(cfg, tp, m, arch), m, "kda", f"prompt {m}"))
    out += [row(c, m, "hc", f"prompt {m}") for c in calls.hc_prompt(cfg, tp, m, arch)]
    return out
