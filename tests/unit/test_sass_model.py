"""bench/sass_model.py and bench/roofline.py: the speed model read from the compiled kernels (NVRTC cubin,
cuobjdump SASS). Skipped only when cupy (NVRTC) or the nvidia-cuda-cuobjdump wheel is not installed (both are in
the test extra)."""
from __future__ import annotations

import importlib.util

import pytest

if importlib.util.find_spec("cupy") is None:
    pytest.skip("cupy is not installed (the test extra's cupy-cuda12x + nvidia-cuda-nvrtc-cu12)",
                allow_module_level=True)

from bench.sass import compile as sass_compile  # noqa: E402
from bench.sass import calls, hw, model  # noqa: E402

try:
    sass_compile.cuobjdump()
except sass_compile.DisassemblerUnavailable as e:
    pytest.skip(str(e), allow_module_level=True)

# a loop whose body is REPS x 64 steps of an integer hash of one loaded value, then one FADD: REPS=2 issues about
# twice REPS=1's instructions for the same one product a thread an iteration
PLANTED = r"""
extern "C" __global__ void planted(const float* __restrict__ x, float* __restrict__ y, int n) {
  float acc = 0.0f;
#pragma unroll 1
  for (int i = threadIdx.x; i < n; i += 32) {
    unsigned v = __float_as_uint(x[i]);
#pragma unroll
    for (int r = 0; r < 64 * REPS; ++r) v = (v ^ (v >> 7)) * 0x9E3779B1u + (unsigned)r;
    acc = acc + __uint_as_float(v);
  }
  y[threadIdx.x] = acc;
}
"""


def _planted(path, reps: int) -> model.Analysis:
    k = model.Kernel("planted", str(path), "prompt", "mac", 32)
    return model.analyse(k, "sm_90", (f"REPS={reps}",))


def test_planted_loop_with_twice_the_instructions_doubles_the_issue_bound(tmp_path):
    path = tmp_path / "planted.cu"
    path.write_text(PLANTED)
    one, two = _planted(path, 1), _planted(path, 2)
    ratio = two.counts.instr / one.counts.instr
    assert 1.9 < ratio < 2.1, (one.counts, two.counts)
    assert one.counts.fadd == two.counts.fadd == 1 and one.counts.global_loads == two.counts.global_loads == 1
    t1, t2 = (model.bounds(model.Call(a, 1e9, 0.0, 0.0, 10_000))["issue_bound_us"] for a in (one, two))
    assert t2 / t1 == pytest.approx(ratio, rel=1e-9)
    assert t1 == pytest.approx(1e9 * one.instr_per_unit / (hw.SMS * hw.ISSUE_SLOTS * hw.CLOCK_HZ) * 1e6)


def test_gemv_lane16_counts_the_tensor_core_loop_of_its_row_tiles():
    """The bf16 decode GEMV runs on the tensor core (gemv_tc.cuh): up to 8 rows one mma tile, 9..16 two; the model
    counts the HMMA loop (256 weights an HMMA a tile), so 1, 3 and 4 rows issue alike, 16 more, and the issue bound
    sits under the memory bound (well under it up to 8 rows)."""
    n = k = 4096
    c = {r: calls.gemv("dense", "bf16", n, k, r, 2 * n * k) for r in (1, 3, 4, 16)}
    a = {r: c[r].analysis for r in c}
    assert a[1].kernel.name == "gemv_lane16" and a[1].counts.tensor > 0 and a[1].counts.shared_loads == 0
    assert a[1].counts == a[3].counts == a[4].counts
    assert a[16].counts.tensor == 2 * a[1].counts.tensor
    assert a[1].instr_per_unit < a[16].instr_per_unit
    for r in c:
        b = model.bounds(c[r])
        assert b["issue_bound_us"] <= (0.6 if r <= 8 else 1.0) * b["memory_bound_us"], (r, b)


def test_gemv_lane16_counts_the_loop_of_its_row_tiles():
    """The decode GEMVs run on the tensor core (gemv_tc.cuh, gemv_q_tc.cuh): the model counts the mma loop of the
    rows' tile count, 256 weights a HMMA for each 8-row tile, so up to 8 rows issue one tile's loop, 16 two."""
    n = k = 4096
    for fmt, stored in (("bf16", 2 * n * k), ("nvfp4", n * k // 2 + n * k // 16)):
        c = {r: calls.gemv("dense", fmt, n, k, r, stored) for r in (1, 3, 4, 16)}
        a = {r: c[r].analysis for r in c}
        assert [a[r].kernel.bucket for r in (1, 3, 4, 16)] == [1, 4, 4, 16]
        assert a[1].counts.tensor > 0 and a[1].counts.shared_loads == 0
        assert a[1].counts == a[3].counts == a[4].counts
        assert a[16].counts.tensor > a[1].counts.tensor
        assert a[1].units_per_iter == 256 * a[1].counts.tensor
        assert a[16].units_per_iter == 128 * a[16].counts.tensor
        issue = {r: model.bounds(c[r])["issue_bound_us"] for r in c}
        assert issue[1] == issue[4]                     # one tile's loop up to 8 rows


# the bf16 forms' ceilings at the model's shapes (issue bound / memory bound); the rmsnorm prologue builds each x chunk
# in every column block, so its 16-row loop sits at about 0.62
BF16_CEILING = {"multi rmsnorm": {16: 0.65}}


@pytest.mark.parametrize("rows", (1, 4, 16))
def test_bf16_decode_gemvs_issue_under_their_memory_bound(rows):
    """Every bf16 decode GEMV form at the full model's TP=2 shapes: issue bound <= 0.6 x memory bound (DESIGN §3b)."""
    from bench.sass.table import _gemv_rows
    from cupyglm.config import preset

    out = _gemv_rows(preset("glm-5.3-flash"), 2, "bf16", rows, "sm_90")
    assert {r["form"] for r in out} >= {"dense", "swiglu", "grouped", "grouped swiglu", "per-head", "multi",
                                        "multi swiglu", "multi rmsnorm"}
    for r in out:
        ceiling = BF16_CEILING.get(r["form"], {}).get(rows, 0.6)
        assert r["issue_bound_us"] <= ceiling * r["memory_bound_us"], (r["form"], rows, r["issue_bound_us"],
                                                                         r["memory_bound_us"])


# the quantised forms' ceilings (issue bound / memory bound): NVFP4 decodes two codes a byte by permutes
Q_CEILING = {"fp8": 0.4, "nvfp4": 0.85}


@pytest.mark.parametrize("rows", (1, 16))
@pytest.mark.parametrize("fmt", ("fp8", "nvfp4"))
def test_quantised_decode_gemvs_issue_under_their_memory_bound(fmt, rows):
    """Every FP8 / NVFP4 decode GEMV form at the full model's TP=2 shapes issues under its memory bound; the dense
    SwiGLU's pair blocks (8 columns of gate and up) give its small N twice the blocks of the 16-column grid."""
    from bench.sass.table import _gemv_rows
    from cupyglm.config import preset
    from cupyglm.kernels.ops_gemv_q import PAIR_OUTS

    out = _gemv_rows(preset("glm-5.3-flash"), 2, fmt, rows, "sm_90")
    assert {r["form"] for r in out} >= {"dense", "swiglu", "grouped", "grouped swiglu", "multi rmsnorm"}
    for r in out:
        if r["form"] == "multi rmsnorm":        # its loop builds the normed x: held to the separate launches below
            continue
        assert r["issue_bound_us"] <= Q_CEILING[fmt] * r["memory_bound_us"], (r["form"], rows, r["issue_bound_us"],
                                                                              r["memory_bound_us"])
    c = calls.gemv("swiglu", fmt, 1024, 4096, rows, 1024 * 4096, nw=2)
    assert c.blocks == 1024 // PAIR_OUTS


@pytest.mark.parametrize("rows", (1, 16))
@pytest.mark.parametrize("fmt", ("fp8", "nvfp4"))
def test_a_quantised_q_b_behind_its_norm_beats_the_norm_launch(fmt, rows):
    """gemv_q_norm.cu's q_b builds each normed x chunk in every column block, so it issues above its small weight
    stream; it must still be faster than what it replaces: the norm launch, then the plain quantised GEMV."""
    from bench.sass.step import _tables
    from bench.sass.table import _shape
    from cupyglm.config import preset

    cfg = preset("glm-5.3-flash")
    n, k, st, q = _shape(*_tables(cfg, 2, fmt), "self_attn.q_b_proj.weight")
    assert q
    fused = model.bounds(calls.gemv("multi rmsnorm", fmt, n, k, rows, st))["predicted_us"]
    apart = (model.bounds(calls.norm(cfg, rows))["predicted_us"]
             + model.bounds(calls.gemv("dense", fmt, n, k, rows, st))["predicted_us"])
    assert fused < apart, (fused, apart)


@pytest.mark.parametrize("fmt", ("bf16", "fp8", "nvfp4"))
def test_a_moe_layer_decodes_in_moe_experts_two_launches(fmt):
    """The speed model's decode step mirrors ops.moe_experts: in every format a MoE layer's routed experts are
    moe_decode.cu's two launches (their own SASS), no routing / sort / combine launch beside them, and the shared
    expert's down inside the second."""
    from bench.sass import step
    from cupyglm.config import preset

    out, _ = step._decode(preset("glm-5.3-flash"), 2, fmt, 1, "sm_90")
    layers = sum(label == "experts gate+up" for label, _ in out)
    moe = [c for _, c in out if c.analysis is not None and c.analysis.kernel.file == "moe_decode.cu"]
    q = "" if fmt == "bf16" else f"_{fmt}"
    assert layers > 0 and {c.analysis.kernel.name for c in moe} == {f"moe_route_swiglu{q}_lane16",
                                                                    f"moe_down_combine{q}_lane16"}
    assert sum(c.launched for c in moe) == 2 * layers and all(c.analysis is not None for _, c in out)
    shared = [c for label, c in out if "shared_experts.down_proj" in label]
    assert len(shared) == layers and not any(c.launched for c in shared)


def test_bf16_decode_gemv_loop_loads_whole_vectors_only():
    """The aligned rows' loop (gemv_tc.cuh's WHOLE run) holds one 16-byte load per weight column pair and row tile
    of each 32-block, nothing read element by element: U = 2 blocks x (2 weights x 2 columns + 1 row tile)."""
    c = calls.gemv("swiglu", "bf16", 4096, 4096, 1, 2 * 2 * 4096 * 4096, nw=2)
    counts = c.analysis.counts
    assert counts.tensor == 8 and counts.global_loads == 10, counts
    assert counts.instr < 160, counts


def test_roofline_prints_predictions_without_fixed_fractions(capsys):
    import bench.roofline as roofline

    assert not any(hasattr(roofline, n) for n in ("EXPECTED", "GEMV_FRACTION", "LAUNCHES_PER_LAYER"))
    assert roofline.main(["--tp", "8", "--quant", "bf16", "--batch", "1", "--context", "4096", "--prefill"]) == 0
    out = capsys.readouterr().out
    assert "262 / 145" in out and "7.85" in out and "%" not in out.split("predicted tok/s")[0]
    row = next(line.split() for line in out.splitlines() if line.split()[:2] == ["8", "bf16"])
    from cupyglm.config import preset

    d = roofline.decode(preset("glm-5.3-flash"), 8, "bf16", 1, 4096)
    assert float(row[6]) == pytest.approx(d["predicted_ms"], abs=0.01)
    assert d["predicted_tok_s"] < d["roofline_tok_s"]


def test_loops_found_with_either_branch_guard():
    """A back-edge guarded by @P (sm_90) or by a uniform predicate operand (sm_120's BRA.U) closes a loop; a
    branch to itself (the end-of-kernel trap) does not."""
    from bench.sass import parse

    sass = """
        Function : k
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   FADD R2, R2, R3 ;
        /*0020*/               @P0 BRA 0x10 ;
        /*0030*/                   FMUL R2, R2, R3 ;
        /*0040*/                   FADD R2, R2, R3 ;
        /*0050*/                   BRA.U UP0, 0x30 ;
        /*0060*/                   BRA 0x60;
"""
    code = parse.functions(sass)["k"]
    assert [(lp.start, lp.end) for lp in parse.loops(code)] == [(1, 2), (3, 5)]
    loop, counts = parse.hot_loop(code)
    assert (loop.start, counts.instr, counts.fp, counts.fmul) == (3, 3, 2, 1)


def test_gemm_tc_counts_its_hmma_loop_and_is_bounded_by_its_tiles_l2_traffic():
    """The prompt GEMM on the tensor core (gemm_tc.cu): the model counts its stage loop of shared-memory fragment
    loads and mma (not the element-load path), every FLOP of it an HMMA's; its blocks load blocks x (TILE_M +
    TILE_N) x K x 2 bytes from L2, and at M 1024 N 4096 K 4096 its prediction is the largest bound (L2 for 32 x 64
    tiles); --gemm's row is this call's."""
    from bench.sass import table
    from cupyglm.kernels import ops_gemm_tc

    m, n, k = 1024, 4096, 4096
    c = calls.gemm_tc(m, n, k, 2.0 * n * k)
    a = c.analysis
    assert a.kernel.name == "gemm_tc_bf16" and a.counts.tensor >= 16
    assert a.counts.fadd == 0 and a.counts.shared_loads >= 16 and a.counts.predicated <= 8   # staged k-tiles
    assert a.units_per_iter == 2 * 16 * 8 * 16 * a.counts.tensor
    b = model.bounds(c)
    assert b["tensor_bound_us"] == pytest.approx(2.0 * m * n * k / hw.TENSOR_BF16_FLOPS * 1e6)
    tm, tn = ops_gemm_tc.DENSE_TILE_M, ops_gemm_tc.DENSE_TILE_N
    assert c.blocks == (m // tm) * (n // tn) and c.l2_bytes == c.blocks * (tm + tn) * k * 2
    assert b["l2_bound_us"] == pytest.approx(c.l2_bytes / hw.L2_BYTES_S * 1e6)
    top = max(b[f"{x}_bound_us"] for x in ("issue", "memory", "l2", "tensor"))
    assert b["predicted_us"] == pytest.approx(top + hw.LAUNCH_US) and b[f"{b['bound']}_bound_us"] == top
    if (tm, tn) == (32, 64):
        assert b["bound"] == "l2"
    (tc,) = table.gemm_rows(m, n, k)
    assert tc["kernel"] == "gemm_tc_bf16" and tc["form"] == "dense" and tc["tensor_instr_per_unit"] > 0
    assert tc["predicted_us"] == pytest.approx(b["predicted_us"]) and 0 < tc["tensor_peak_pct"] <= 100


def test_kernel_rows_price_every_prompt_gemm_on_the_tensor_core():
    """kernel_rows' prompt GEMMs: dense and grouped in every format, each a tensor-core kernel (gemm_tc for bf16,
    gemm_tc_q for fp8 / nvfp4) with HMMA in its hot loop, limited by a named bound no lower than its tensor bound;
    no lane-16 prompt kernel is left."""
    from bench.sass import table
    from cupyglm.config import preset

    rows = [r for r in table.kernel_rows(preset("glm-5.3-flash"), 2, (1,), 1024) if r["role"] == "prompt"]
    gemms = {(r["dtype"], r["form"]): r for r in rows if r["kernel"].startswith("gemm")}
    want = {("bf16", "dense"): "gemm_tc_bf16", ("bf16", "grouped"): "gemm_tc_grouped_bf16"}
    want.update({(f, "dense"): f"gemm_tc_{f}_bf16" for f in ("fp8", "nvfp4")})
    want.update({(f, "grouped"): f"gemm_tc_grouped_{f}_bf16" for f in ("fp8", "nvfp4")})
    assert {key: r["kernel"] for key, r in gemms.items()} == want
    for r in gemms.values():
        assert r["tensor_instr_per_unit"] > 0 and r["bound"] in ("issue", "memory", "l2", "tensor")
        assert r["predicted_us"] >= r["tensor_bound_us"] > 0
    assert not any("lane16" in r["kernel"] for r in rows)


def test_a_pass_without_a_kernel_is_priced_by_its_bytes_and_tiles_count_their_operands():
    """model.Call with no analysis (an elementwise or dequantisation pass): memory bound + launch only;
    tile_l2_bytes: row tiles x column tiles x K x (TILE_M x-bytes + TILE_N w-bytes)."""
    b = model.bounds(model.Call(None, 0.0, 4.3e9, 0.0, 1))
    assert b["bound"] == "memory" and b["predicted_us"] == pytest.approx(1e3 + hw.LAUNCH_US)
    assert b["issue_bound_us"] == b["l2_bound_us"] == b["tensor_bound_us"] == 0.0
    assert model.tile_l2_bytes(100, 64, 32, 64, 3) == 3 * 2 * 64 * (32 * 2 + 64 * 2)
    assert model.tile_l2_bytes(64, 64, 32, 64, 1, w_bytes=0.5) == 64 * (32 * 2 + 64 * 0.5)


def test_prefill_runs_on_the_tensor_core_and_prints_one_prediction(capsys):
    """bench/roofline.py prices a cold prefill on the tensor-core kernels alone (prompt_tc, attention_tc): its GEMMs
    are gemm_tc / gemm_tc_q calls limited by a named bound, the roofline (the work the model needs:
    step.prefill_need) stays under the prediction, and one predicted figure is printed beside it."""
    import bench.roofline as roofline
    from bench.sass import step
    from cupyglm.config import preset

    cfg = preset("glm-5.3-flash")
    p = roofline.prefill(cfg, 8, "bf16", 4096)
    nbytes, flops = step.prefill_need(cfg, 8, "bf16", 4096)
    assert p["flops"] == flops and p["roofline_s"] == pytest.approx(max(nbytes / hw.HBM_BYTES_S,
                                                                         flops / hw.TENSOR_BF16_FLOPS))
    assert p["roofline_s"] < p["predicted_s"]
    issued = sum(c.flops for _, c in step.prefill_calls(cfg, 8, "bf16", 4096)[0])
    assert issued >= flops                              # the tiles pad the model's FLOPs, never drop them
    kernels = {k[1] for k in p["calls_s"]}
    assert {"gemm_tc_bf16", "gemm_tc_grouped_bf16", "attention_tc"} <= kernels
    assert not any("lane16" in name for name in kernels if name.startswith("gemm"))
    assert all(b in ("issue", "memory", "l2", "tensor") for _, _, b in p["calls_s"])
    q = {k[1] for k in roofline.prefill(cfg, 2, "nvfp4", 4096)["calls_s"]}
    assert {"gemm_tc_nvfp4_bf16", "gemm_tc_grouped_nvfp4_bf16"} <= q
    assert roofline.main(["--tp", "8", "--quant", "bf16", "--batch", "1", "--context", "4096", "--prefill", "4096",
                          "--parts"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "cold prefill" in x)
    assert "predicted (tensor core)" in line and "roofline" in line and "lane-16" not in out
    assert "KDA recurrence" in out and "-bound" in out


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_gemm_tc_q_counts_its_hmma_loop_and_prices_its_tiles(fmt):
    """The quantised prompt GEMM on the tensor core (gemm_tc_q.cu), dense and grouped: its hot loop is the staged
    tile's whole-stage mma loop (HMMA from shared memory, its copies in flight, no FADDs: the closes and folds lie
    outside it); at M 2048 N 4096 K 8192 its issue bound is under three times its tensor bound, its L2 bytes are row
    tiles x column tiles x K x (128 x 2 + 128 x the weight's stored bytes an element), and its prediction is its
    largest bound. Grouped over 64 experts: 64 - 1 extra row-tile passes, each expert's weights read once."""
    from cupyglm.kernels import ops_gemm_tc_q as gq

    m, n, k = 2048, 4096, 8192
    st = n * k * (1.0 if fmt == "fp8" else 0.5)
    c = calls.gemm_tc_q(fmt, m, n, k, st)
    a = c.analysis
    assert a.kernel.name == f"gemm_tc_{fmt}_bf16" and a.counts.tensor >= 16
    assert a.counts.fadd == 0 and a.counts.shared_loads > 0 and a.kernel.dyn_shared == gq.SHARED[fmt]
    b = model.bounds(c)
    assert b["tensor_bound_us"] / b["issue_bound_us"] >= 0.35
    tm, tn = gq.TILE_M, gq.TILE_N
    assert c.blocks == (m // tm) * (n // tn)
    assert c.l2_bytes == pytest.approx((m // tm) * (n // tn) * k * (tm * 2 + tn * st / (n * k)))
    top = max(b[f"{x}_bound_us"] for x in ("issue", "memory", "l2", "tensor"))
    assert b["predicted_us"] == pytest.approx(top + hw.LAUNCH_US)
    g = calls.gemm_tc_q(fmt, m, n, k, st, slices=64)
    assert g.analysis.kernel.name == f"gemm_tc_grouped_{fmt}_bf16" and g.analysis.counts.tensor >= 16
    passes = m // tm + 63
    assert g.flops == 2.0 * tm * passes * n * k and g.bytes == 64 * st + m * (k + n) * 2
    assert g.l2_bytes == pytest.approx(passes * (n // tn) * k * (tm * 2 + tn * st / (n * k)))


@pytest.mark.parametrize("rows", (1, 16))
def test_a_decode_hyper_connection_step_is_priced_by_its_own_kernels(rows):
    """A sublayer's hc_post + hc_pre + norm on decode rows is hc_split.cu's two launches, priced by their SASS (not
    by the plain RMSNorm): its dots' loop reads four staged terms a load (under 4 instructions a term a lane) and the
    step beats hc.cu's one block a row, whose 128 threads sum every dot of the row."""
    from bench.sass import step
    from cupyglm.config import preset

    cfg = preset("glm-5.3-flash")
    split = calls.hc_decode(cfg, 8, rows)
    mix = split[1].analysis
    assert mix.kernel.name == "hc_mix_norm" and mix.instr_per_unit * 2 * 32 < 4
    row = model.analyse(calls.K.HC_ROW)
    assert row.counts.global_loads == 2 * row.counts.fmul                  # hc.cu's dot loop, not its Sinkhorn
    s, d, k, fn = calls._hc_shape(cfg)
    one = model.Call(row, 2.0 * (s * (s + 2) + 1) * k * rows, fn, 0.0, rows)
    assert sum(model.bounds(c)["predicted_us"] for c in split) < model.bounds(one)["predicted_us"]
    out, _ = step.decode_calls(cfg, 8, "bf16", rows, 4096)
    names = [c.analysis.kernel.name for label, c in out if label == "norms" and c.analysis]
    assert names.count("hc_mix_norm") == 2 * cfg.num_hidden_layers and "rmsnorm_rows" not in names
