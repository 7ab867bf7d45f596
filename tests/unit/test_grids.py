"""Launch grids: the number of tokens (rows) is on grid.x (up to 2^31 - 1 blocks), never on grid.y or grid.z
(65,535). Checked through the launchers with a Kernels that records each launch instead of running it, at
M = 70,000 rows (over the y limit when one row is one block)."""
from __future__ import annotations

import numpy as np
import pytest

from cupyglm.backend.lanes import BF16
from cupyglm.backend.qweight import QWeight
from cupyglm.kernels import ops_attention, ops_gemm, ops_gemm_tc, ops_hc, ops_indexer, ops_kv, ops_moe, ops_norm
from cupyglm.kernels.ops import Kernels

M = 70_000
Y_LIMIT = 65_535


class RecordingKernels(Kernels):
    """The sim backend's launchers, but every launch is recorded (kernel, grid padded to 3, block), not run."""

    def __init__(self):
        super().__init__("sim", np)
        self.launches: list[tuple[str, tuple[int, int, int], tuple]] = []

    def empty(self, shape, dtype=np.float32):
        return np.zeros(shape, dtype)

    def launch(self, source, name, grid, block, args, shared_mem=0):
        g = tuple(grid) + (1,) * (3 - len(tuple(grid)))
        self.launches.append((name, g, tuple(block)))


def _bf(shape):
    return np.zeros(shape, BF16)


def _f(shape):
    return np.zeros(shape, np.float32)


def _nvfp4(shape):
    n, k = shape
    return QWeight("nvfp4", shape, np.zeros((n, k // 2), np.uint8), np.zeros((n, k // 16), np.uint8),
                   np.ones(1, np.float32))


CALLS = {
    # kernel: (launch it at m rows, the grid it must get at m rows)
    "gemm_tc": (lambda k, m: ops_gemm.gemm(k, _bf((m, 32)), _bf((40, 32))), lambda m: (-(-m // 128), 1, 1)),
    "gemm_tc_bf16": (lambda k, m: ops_gemm.gemm(k, _bf((m, 32)), _bf((300, 32)), out="bf16"),
                     lambda m: (-(-m // 128), 2, 1)),
    "gemm_tc heads": (lambda k, m: ops_gemm.gemm_heads(k, _bf((2, m, 16)), _bf((2, 20, 16))),
                      lambda m: (-(-m // 128), 1, 2)),
    "gemm_tc_grouped": (lambda k, m: ops_gemm.gemm_grouped(k, _bf((m, 32)), _bf((3, 40, 32)), np.zeros(m, np.int32)),
                        lambda m: (-(-m // 128), 1, 1)),
    "gemm_tc_nvfp4": (lambda k, m: ops_gemm.gemm(k, _bf((m, 64)), _nvfp4((300, 64))), lambda m: (-(-m // 128), 3, 1)),
    "hc_post": (lambda k, m: ops_hc.hc_post(k, _bf((m, 4, 300)), _f((m, 300)), _f((m, 4)), _f((m, 4, 4))),
                lambda m: (m, 2, 1)),
    "stream_mean": (lambda k, m: ops_hc.stream_mean(k, _bf((m, 4, 300))), lambda m: (m, 2, 1)),
    "moe_combine": (lambda k, m: ops_moe.moe_combine(k, _f((m, 2, 300)), _f((m, 2)), _f((m, 300))),
                    lambda m: (m, 2, 1)),
    "attention": (lambda k, m: ops_attention.attention(k, _bf((m, 3, 16)), _bf((8, 16)), np.zeros((m, 4), np.int32),
                                                       np.ones(m, np.int32), 0.25, 4), lambda m: (m, 3, 1)),
    "index_scores": (lambda k, m: ops_indexer.index_scores(k, _bf((m, 2, 16)), _f((m, 2)), _bf((40, 16))),
                     lambda m: (-(-m // ops_indexer.ROWS) * -(-40 // (ops_indexer.WARP_POOLS * ops_indexer.WARPS)),
                               1, 1)),
    "index_scores_rows": (lambda k, m: ops_indexer.index_scores_rows(k, _bf((m, 2, 16)), _f((m, 2)), 0.5, _bf((40, 16)),
                                                                     np.zeros((1, 32), np.int32),
                                                                     np.zeros(m, np.int32)),
                          lambda m: (m * -(-32 // (ops_indexer.WARP_POOLS * ops_indexer.ROWS_WARPS)), 1, 1)),
    "rmsnorm_rows": (lambda k, m: ops_norm.rmsnorm(k, _bf((m, 16)), _bf((16,)), 1e-5), lambda m: (m, 1, 1)),
    "kv_read_rows": (lambda k, m: ops_kv.read_rows(k, _bf((8, 16)), np.zeros(m, np.int32)), lambda m: (m, 1, 1)),
    "kv_write_rows_rmsnorm_keys": (lambda k, m: ops_kv.write_rows_rmsnorm_keys(
        k, _bf((8, 16)), np.zeros(m, np.int32), _bf((m, 16)), _bf((16,)), 1e-5, _bf((m, 24)), _bf((24,)), _bf((24,)),
        1e-6, distinct_on_host=True), lambda m: (m, 2, 1)),
}


def _grid(name: str, m: int):
    k = RecordingKernels()
    CALLS[name][0](k, m)
    assert len(k.launches) == 1
    kernel, grid, _ = k.launches[0]
    assert kernel == name.split()[0]
    return grid


@pytest.mark.parametrize("name", list(CALLS))
def test_token_count_is_on_grid_x(name):
    grid = _grid(name, M)
    assert grid == CALLS[name][1](M), f"{name}: grid {grid}"
    assert grid[1] <= Y_LIMIT and grid[2] <= Y_LIMIT


@pytest.mark.parametrize("name", list(CALLS))
def test_y_and_z_do_not_grow_with_the_rows(name):
    g1, g2 = _grid(name, 1000), _grid(name, 2000)
    assert g1[1:] == g2[1:] and g2[0] > g1[0], (g1, g2)


def test_gemm_refuses_a_column_count_over_the_y_limit():
    with pytest.raises(ValueError, match="65,535"):
        ops_gemm_tc.grid(4, 256 * Y_LIMIT + 1)
