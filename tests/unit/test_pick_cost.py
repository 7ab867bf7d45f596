"""bench/pick_cost.py models the kernels it estimates: the parts of cuda_src/pick.cu, the select's threshold, the
merge's premise (a row's top npools are among its parts' kept pools), the launches at short and long windows."""
from __future__ import annotations

import numpy as np

from bench import pick_cost
from cupyglm.kernels import ops_pick


def test_parts_are_the_launchers():
    assert pick_cost.PART == ops_pick.PART
    assert ops_pick.parts(ops_pick.PART) == 1 and ops_pick.parts(ops_pick.PART + 1) == 2
    assert ops_pick.scratch_cols(ops_pick.PART, 512) == 0 and ops_pick.scratch_cols(3 * ops_pick.PART, 512) == 3 * 512


def test_select_finds_the_npools_th_key_and_the_parts_keep_the_top():
    rng = np.random.default_rng(3)
    s = np.round(rng.standard_normal(3 * pick_cost.PART + 17) * 8).astype(np.float32)     # many ties
    keys = pick_cost._keys(s)
    _, t = pick_cost._select(keys, 512)
    assert t == np.sort(keys)[::-1][511]
    top = set(np.lexsort((np.arange(s.size), -keys.astype(np.int64)))[:512].tolist())
    kept = set()
    for lo in range(0, s.size, pick_cost.PART):
        part = keys[lo:lo + pick_cost.PART]
        kept |= {lo + int(i) for i in np.lexsort((np.arange(part.size), -part.astype(np.int64)))[:512]}
    assert top <= kept


def test_estimate_lines(capsys):
    assert pick_cost.main(["--tokens", "4096", "1048576", "--rows", "1"]) == 0
    short, long = capsys.readouterr().out.splitlines()[1:]
    assert "after" in short and "(1 launch, 1 block a row)" in short
    assert "(2 launches, 64 blocks a row)" in long
    after = float(long.split("after")[1].split()[0])
    before = float(long.split("before")[1].split()[0])
    assert after < before
