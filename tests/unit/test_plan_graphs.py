"""CUDA graphs in the memory plan (engine/plan_graphs.py): the KDA seats counted exactly, the graphs' pools as a
bound, the pages sized after both, the line shown (plan and cupyglm-plan), and a clear refusal when they do not fit."""
from __future__ import annotations

import pytest

from cupyglm.cli.plan import main as plan_main
from cupyglm.config import preset
from cupyglm.engine.plan import GIB, PlanError, plan_memory
from cupyglm.engine.plan_graphs import graph_pool_bytes, graph_terms
from cupyglm.kv.store import scratch_pages
from cupyglm.memory import BF16_STORAGE, kv_arrays, total_bytes

FULL = preset("glm-5.3-flash")


def _slots(cfg, tp: int) -> int:
    """16 seats per KDA layer of H K K fp32 + (taps - 1) 3HK bf16, and per bucket B (1..16) two [B, 3] tables and
    the [B, H] counters, int32."""
    h, k = cfg.kda_num_heads // tp, cfg.kda_head_dim
    seat = h * k * k * 4 + (cfg.kda_conv_size - 1) * 3 * h * k * 2
    return 16 * seat * len(cfg.kda_layers) + sum(4 * b * (6 + h) for b in (1, 2, 4, 8, 16))


@pytest.mark.parametrize("tp, gib", [(2, 1.10), (8, 0.275)])
def test_the_kda_seats_of_the_full_model_exactly(tp, gib):
    (name, slots, exact), (pname, pools, pexact) = graph_terms(FULL, tp, BF16_STORAGE)
    assert (name, exact, pname, pexact) == ("kda slots", True, "graph pools", False)
    assert slots == _slots(FULL, tp)
    assert abs(slots / GIB - gib) < 0.005                  # 34 KDA layers x 16 seats: ~1.1 GiB at TP=2
    # the pools' bound: 45 layers' outputs in every bucket, 12 static input sets, one layer's temporaries (a DSA
    # layer's at the 1M window's widest pool table), the ends, the DSA maps' buffers of the window's layouts, and
    # the scratch pages
    assert 0.3 * GIB < pools < 0.45 * GIB
    scratch = total_bytes(kv_arrays(FULL, scratch_pages(FULL.page_tokens), FULL.page_tokens), BF16_STORAGE)
    assert pools == sum(graph_pool_bytes(FULL, tp, BF16_STORAGE, b) for b in (1, 2, 4, 8, 16)) + scratch


def test_the_pages_are_sized_after_the_graphs():
    kw = dict(storage=BF16_STORAGE, tp=8, budget_bytes=141 * GIB, weights=70 * GIB)
    off, on = plan_memory(FULL, **kw), plan_memory(FULL, **kw, graphs=True)
    assert off.graph_bytes == 0 and "cuda graphs" not in off.line()
    graph = on.graph_bytes
    assert graph == sum(n for _, n, _ in graph_terms(FULL, 8, BF16_STORAGE))
    assert (off.fit_pages - on.fit_pages) * on.page_bytes >= graph - off.free_bytes
    assert on.free_bytes + on.num_pages * on.page_bytes + graph == off.free_bytes + off.num_pages * off.page_bytes
    assert "cuda graphs 0.63 GiB (kda slots 0.27 GiB + graph pools <= 0.36 GiB)" in on.line()


def test_graphs_that_do_not_fit_are_refused_by_name():
    kw = dict(storage=BF16_STORAGE, tp=2, weights=70 * GIB, reserve_gib=1.0)
    base = plan_memory(FULL, **kw, budget_bytes=141 * GIB)
    left = 141 * GIB - base.num_pages * base.page_bytes - base.free_bytes      # weights + scratch + reserve
    budget = left + base.page_bytes + GIB // 2                                 # a page fits, the 1.48 GiB do not
    assert plan_memory(FULL, **kw, budget_bytes=budget).num_pages >= 1
    with pytest.raises(PlanError, match=r"CUDA graphs do not fit on rank 0: they need 1\.48 GiB \(kda slots "
                                        r"1\.10 GiB \+ graph pools <= 0\.39 GiB\).*CUPYGLM_CUDA_GRAPHS=0"):
        plan_memory(FULL, **kw, budget_bytes=budget, graphs=True)


def test_cli_prints_the_graphs_line(capsys):
    assert plan_main(["--tp", "8", "--card-gib", "141", "--weights-gib", "70", "--cuda-graphs"]) == 0
    assert "cuda graphs 0.63 GiB (kda slots 0.27 GiB + graph pools <= 0.36 GiB)" in capsys.readouterr().out
    assert plan_main(["--tp", "2", "--card-gib", "73.5", "--weights-gib", "70", "--cuda-graphs", "--no-vision"]) == 1
    assert "PlanError: CUDA graphs do not fit" in capsys.readouterr().err


def test_the_dsa_maps_layouts_are_those_a_window_reaches():
    """dsa_layouts: the (width, Pw) buckets of every longest-sequence length 1 .. window, found at the steps alone;
    the plan's window sizes the DSA terms (a shorter --context, a smaller bound)."""
    from cupyglm.engine.plan_graphs import dsa_layouts
    from cupyglm.model.seg_device import width_bucket

    for pt, window in ((512, 70000), (16, 1000), (12, 777), (4, 300)):
        every = sorted({(width_bucket(-(-n // pt)), width_bucket(n // FULL.index_kpool)) for n in range(1, window + 1)})
        assert dsa_layouts(FULL, pt, window) == every
    short, full = (graph_terms(FULL, 2, BF16_STORAGE, w)[1][1] for w in (131072, 0))
    assert short < full
