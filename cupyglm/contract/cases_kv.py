"""Contract cases of cuda_src/kv.cu (ops write_rows, read_rows): latent rows (C = R = 64) and pooled keys
(C = I = 32) through a shuffled page table of 16-token pages, like kv/store.py.

Rows the call must not touch are NaN: a write must leave them NaN, a read must never return them.
Controls: write_rows with two slots swapped; read_rows through a wrong page mapping (two pages swapped).
read_rows is also the token embedding gather (embed[...] cases at vocabulary shapes).
*.flags: the kernels counting ids outside [0, N) into their guard slot themselves (the write skips the row,
the read gives NaN; sim checks every address); control: the variant KV_PLANT_FLAG (the id N is not counted).
The normed latent write with the index keys (kv_write_rows_rmsnorm_keys): cases_kv_norm.py.
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend.lanes import BF16, bf16
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.contract.registry import Case, case
from cupyglm.kernels import ops_kv

REF = NumpyOps()
PAGE = 16


def _rows(pages: np.ndarray, positions: np.ndarray) -> np.ndarray:
    return (pages[positions // PAGE] * PAGE + positions % PAGE).astype(np.int32)


def _layout(rng, num_pages: int, start: int, n: int):
    pages = rng.permutation(num_pages)[: -(-(start + n) // PAGE)].astype(np.int64)
    return pages, np.arange(start, start + n)


def _write_inputs(rng, num_pages: int, cols: int, start: int, n: int) -> dict:
    pages, pos = _layout(rng, num_pages, start, n)
    store = np.full((num_pages * PAGE, cols), np.nan, dtype=BF16)      # [rows, C] bf16
    old = _rows(pages, np.arange(start))                             # earlier positions: kept values
    store[old] = bf16(rng.standard_normal((old.size, cols)).astype(np.float32))
    return {"store": store, "rows": _rows(pages, pos),
            "values": bf16(rng.standard_normal((n, cols)).astype(np.float32)), "pages": pages}


def _write(label: str, num_pages: int, cols: int, start: int, n: int) -> Case:
    def make(rng):
        return _write_inputs(rng, num_pages, cols, start, n)

    def run(k, d):
        ops_kv.write_rows(k, d["store"], d["rows"], d["values"])
        return {"store": d["store"]}

    def replay(d):
        REF.write_rows(d["store"], d["rows"], d["values"])
        return {"store": d["store"]}

    def ctl(k, d):
        rows = d["rows"].copy()
        if rows.shape[0] > 1:
            rows[[0, -1]] = rows[[-1, 0]]                            # two slots swapped
        else:
            rows[0] = rows[0] + 1 if int(rows[0]) % PAGE < PAGE - 1 else rows[0] - 1   # the neighbour slot
        ops_kv.write_rows(k, d["store"], rows, d["values"])
        return {"store": d["store"]}

    return case(Case(f"write_rows[{label}]", ("kv_write_rows",), make, run, replay, ctl))


def _read(label: str, num_pages: int, cols: int, start: int, n: int) -> Case:
    def make(rng):
        pages, pos = _layout(rng, num_pages, start, n)
        store = np.full((num_pages * PAGE, cols), np.nan, dtype=BF16)      # [rows, C] bf16
        live = _rows(pages, np.arange(start + n))
        store[live] = bf16(rng.standard_normal((live.size, cols)).astype(np.float32))
        return {"store": store, "rows": _rows(pages, pos), "pages": pages, "pos": pos}

    def run(k, d):
        return {"y": ops_kv.read_rows(k, d["store"], d["rows"])}

    def replay(d):
        return {"y": REF.read_rows(d["store"], d["rows"])}

    def ctl(k, d):
        pages = np.array(d["pages"]) if isinstance(d["pages"], np.ndarray) else k.xp.asnumpy(d["pages"])
        pos = np.array(d["pos"]) if isinstance(d["pos"], np.ndarray) else k.xp.asnumpy(d["pos"])
        wrong = pages.copy()
        if wrong.size > 1:
            wrong[[0, -1]] = wrong[[-1, 0]]                          # two pages swapped in the table
        else:
            wrong[0] = (wrong[0] + 1) % num_pages                    # the page table names another page
        return {"y": ops_kv.read_rows(k, d["store"], k.xp.asarray(_rows(wrong, pos)))}

    return case(Case(f"read_rows[{label}]", ("kv_read_rows",), make, run, replay, ctl))


#       label              pages cols start  n
_write("latent-decode",      8,  64,   37,   1)     # one token's latent row
_write("latent-verify",      8,  64,   40,  16)     # 16 rows crossing a page boundary
_write("latent-prompt100",  10,  64,    0, 100)     # a prompt from position 0, 7 pages
_write("pooled-odd",         8,  32,    5,  11)     # pooled keys, odd count
_read("pooled-decode",       8,  32,   20,   1)
_read("pooled-prompt64",     8,  32,    0,  64)
_read("latent-odd",          8,  64,   13,  37)


def _embed(label: str, vocab: int, dim: int, t: int) -> Case:
    """read_rows as the token embedding gather; table rows no id names are NaN (never read).
    Control: an off-by-one gather (every id + 1)."""
    def make(rng):
        table = bf16(rng.standard_normal((vocab, dim)).astype(np.float32))
        ids = rng.integers(0, vocab - 1, t).astype(np.int32)
        unused = np.setdiff1d(np.arange(vocab), ids)
        table[unused[: len(unused) // 2]] = np.nan
        return {"table": table, "ids": ids}

    def run(k, d):
        return {"y": ops_kv.read_rows(k, d["table"], d["ids"])}

    def replay(d):
        return {"y": REF.read_rows(d["table"], d["ids"])}

    def ctl(k, d):
        return {"y": ops_kv.read_rows(k, d["table"], d["ids"] + 1)}

    return case(Case(f"embed[{label}]", ("kv_read_rows",), make, run, replay, ctl))


_embed("decode", 512, 256, 1)
_embed("prompt64", 512, 256, 64)
_embed("odd", 300, 100, 7)


SLOTS, SLOT = 3, 1                 # slot 0 must stay clear: the slot argument is honoured


def _bad_ids(rng, n_store: int, n: int) -> np.ndarray:
    ids = rng.permutation(n_store)[:n].astype(np.int32)
    ids[[1, 4, n - 1]] = (n_store, -1, n_store + 1000)              # the limit itself first (planted: passes)
    return ids


def _flags_out(ids: np.ndarray, n_store: int) -> np.ndarray:
    f = np.zeros((SLOTS, 2), dtype=np.uint32)
    bad = np.flatnonzero((ids < 0) | (ids >= n_store))
    f[SLOT] = (bad.size, ~np.uint32(bad.min()))
    return f


def _flags_case(op: str, n_store: int, cols: int, n: int) -> Case:
    def make(rng):
        store = bf16(rng.standard_normal((n_store, cols)).astype(np.float32))       # [N, C] bf16
        return {"store": store, "rows": _bad_ids(rng, n_store, n),
                "values": bf16(rng.standard_normal((n, cols)).astype(np.float32))}

    def launch(kn, dd, variant):
        kv = kn.variant("KV_PLANT_FLAG") if variant else kn
        flags = kn.xp.zeros((SLOTS, 2), dtype=np.uint32)
        if op == "write":
            ops_kv.launch_write(kv, dd["store"], dd["rows"], dd["values"], (flags, SLOT))
            return {"store": dd["store"], "flags": flags}
        return {"y": ops_kv.launch_read(kv, dd["store"], dd["rows"], (flags, SLOT)), "flags": flags}

    def replay(dd):
        ids = np.asarray(dd["rows"])
        good = (ids >= 0) & (ids < n_store)
        if op == "write":
            REF.write_rows(dd["store"], ids[good], dd["values"][good])
            return {"store": dd["store"], "flags": _flags_out(ids, n_store)}
        y = np.full((n, cols), np.nan, dtype=BF16)
        y[good] = REF.read_rows(dd["store"], ids[good])
        return {"y": y, "flags": _flags_out(ids, n_store)}

    kernel = {"write": "kv_write_rows", "read": "kv_read_rows"}[op]
    return case(Case(f"{op}_rows.flags[{n}]", (kernel,), make,
                     lambda kn, dd: launch(kn, dd, False), replay, lambda kn, dd: launch(kn, dd, True)))


_flags_case("write", 64, 40, 9)
_flags_case("read", 64, 40, 9)
