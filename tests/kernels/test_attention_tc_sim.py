"""cuda_src/attention_tc.cu on the emulator: the bits of its exact model (backend/tc_attention.py) under the three
thread orders, heads past a block of 16 (zero queries, never stored), a prompt's rows the same whether its chunks
began at 0 or off the 64-position grid, and the launcher's refusals by name."""
from __future__ import annotations

import numpy as np
import pytest

from cupyglm.backend import tc_attention as ta
from cupyglm.backend.lanes import bf16
from cupyglm.backend.numpy_ops import paged_rows
from cupyglm.contract.cases_attention_tc import PAGE, _inputs
from cupyglm.kernels import ops_attention_tc as op
from cupyglm.kernels.ops import Kernels
from cupyglm.kernels.sim_build import TC_ARCH


def _bits(x):
    return np.ascontiguousarray(x).view(np.uint16)


def _run(k, d, scale=0.125):
    return op.attention_tc(k, d["qa"], d["store"], d["tokens"], d["table"], d["seg"], PAGE, d["counts"], scale)


@pytest.mark.parametrize("order", ["forward", "reverse", "shuffled"])
def test_sim_equals_the_model_bit_for_bit(order):
    d = _inputs(np.random.default_rng(7), 32, 64, 50, 3, 3)
    rows = paged_rows(d["tokens"], d["table"], d["seg"], PAGE)
    want = ta.attention_tc(d["qa"], d["store"], d["tokens"], rows, d["counts"], 0.125, arch=TC_ARCH)
    assert np.array_equal(_bits(_run(Kernels("sim", np, order=order), d)), _bits(want))


@pytest.mark.parametrize("h, run", [(8, 3), (16, 2), (40, 1)])
def test_rows_sharing_a_blocks_key_tiles_equal_the_model(h, run):
    d = _inputs(np.random.default_rng(11), h, 64, 60, 5, 4, run)
    rows = paged_rows(d["tokens"], d["table"], d["seg"], PAGE)
    want = ta.attention_tc(d["qa"], d["store"], d["tokens"], rows, d["counts"], 0.125, arch=TC_ARCH)
    assert op.heads_a_block(h) == (16 if h <= 16 else 32)
    assert np.array_equal(_bits(_run(Kernels("sim", np, order="shuffled"), d)), _bits(want))


def test_heads_past_a_block_of_16_are_padded_not_stored():
    d = _inputs(np.random.default_rng(10), 20, 64, 30, 2, 1)
    rows = paged_rows(d["tokens"], d["table"], d["seg"], PAGE)
    want = ta.attention_tc(d["qa"], d["store"], d["tokens"], rows, d["counts"], 0.125, arch=TC_ARCH)
    got = _run(Kernels("sim", np), d)
    assert np.array_equal(_bits(got), _bits(want))
    four = _run(Kernels("sim", np), dict(d, qa=np.ascontiguousarray(d["qa"][:, 16:])))
    assert np.array_equal(_bits(four), _bits(want[:, 16:]))


def test_a_prompts_rows_do_not_depend_on_where_its_chunk_began():
    rng = np.random.default_rng(8)
    n, r = 140, 64
    store = bf16(rng.standard_normal((n, r)).astype(np.float32))
    qa = bf16(rng.standard_normal((n, 16, r)).astype(np.float32) * 0.5)
    table, k = np.arange(-(-n // PAGE), dtype=np.int32)[None], Kernels("sim", np)

    def call(a, b):
        tokens, counts = ta.dense_tokens(a, b - a)
        return op.attention_tc(k, qa[a:b], store, tokens, table, np.zeros(b - a, np.int32), PAGE, counts, 0.125)
    whole = call(100, 140)
    assert np.array_equal(_bits(np.concatenate([call(100, 117), call(117, 140)])), _bits(whole))


def test_refusals_name_what_is_wrong():
    d = _inputs(np.random.default_rng(9), 16, 64, 10, 1, 0)
    k = Kernels("sim", np)
    args = [d["qa"], d["store"], d["tokens"], d["table"], d["seg"], PAGE, d["counts"], 0.1]
    with pytest.raises(ValueError, match="R must be a multiple of 64"):
        op.attention_tc(k, np.ascontiguousarray(d["qa"][..., :32]), np.ascontiguousarray(d["store"][:, :32]), *args[2:])
    with pytest.raises(ValueError, match="page_tokens"):
        op.attention_tc(k, *args[:5], 0, *args[6:])
    with pytest.raises(ValueError, match="parameter qa must be"):
        op.attention_tc(k, d["qa"].astype(np.float32), *args[1:])
    with pytest.raises(ValueError, match="parameter counts"):
        op.attention_tc(k, *args[:6], d["counts"][:0], 0.1)
