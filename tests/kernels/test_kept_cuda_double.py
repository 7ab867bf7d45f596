"""The kept-state copies on the cuda path (the strict CuPy double): one `cudaMemcpyAsync` on the current
stream per walk piece, device arena and pinned mapped host arena, a keep then restore gives the bytes back."""
from __future__ import annotations

import numpy as np
import pytest

from cupy_double.fixtures import cuda_double  # noqa: F401
from cupyglm.config import preset
from cupyglm.kv.state import SeqState
from cupyglm.kv.walk import each


def _state(cfg, ops, kv, length, rng):
    from cupyglm.memory import alloc, kda_state_arrays, storage_of

    xp, st = ops.xp, storage_of(ops)
    s = SeqState(length=length)
    kv.ensure(s.pages, length)
    for layer in cfg.kda_layers:
        a, b = (alloc(xp, spec, st) for spec in kda_state_arrays(cfg, 1, layer))
        a[...] = xp.asarray(rng.standard_normal(a.shape).astype(np.float32))
        b[...] = xp.asarray(rng.integers(0, 1 << 16, b.shape).astype(b.dtype))
        s.kda_state[layer], s.kda_conv[layer] = a, b
    for layer in cfg.dsa_layers:                             # [kpool, I] pairs; the leading length % kpool kept
        s.index_tail[layer] = tuple(xp.asarray(rng.integers(0, 1 << 16, (cfg.index_kpool, cfg.index_head_dim))
                                               .astype(st.bf16)) for _ in range(2))
    for arr in list(kv.latent.values()) + list(kv.pooled.values()):
        arr[...] = xp.asarray(rng.integers(0, 1 << 16, arr.shape).astype(arr.dtype))
    return s


@pytest.mark.parametrize("host", [False, True])
def test_keep_restore_on_cuda_double(cuda_double, host):
    from cupyglm.backend.cuda_ops import CudaOps
    from cupyglm.kv.kept import KeptStore
    from cupyglm.kv.store import KVStore

    cfg = preset("tiny")
    ops = CudaOps()
    kv = KVStore(cfg, ops, 8, cfg.page_tokens)
    rng = np.random.default_rng(1)
    length = 2 * cfg.page_tokens + 5
    src = _state(cfg, ops, kv, length, rng)
    kept = KeptStore(cfg, ops, kv, 1, 1 << 22, host=host)
    pieces = []
    each(kept.parts(src, length), kept_probe(kept, length), lambda d, s, n: pieces.append(n))
    with cuda_double.counting() as c:
        entry = kept.keep(7, src, range(kept.pages_for(src.length)))
    assert c.memcpys == len(pieces) and c.memcpy_bytes == entry.nbytes == sum(pieces)
    assert c.syncs == 0 and c.h2d == 0
    import cupy

    assert set(cuda_double.copies.LAST_STREAMS[-len(pieces):]) == {cupy.cuda.get_current_stream().ptr}
    snap = {k: ops.asnumpy(v).copy() for k, v in src.kda_state.items()}
    pos = np.arange(length)
    before = [ops.asnumpy(kv.latent[l])[kv.rows(src.pages, pos)].copy() for l in cfg.dsa_layers]
    for arr in kv.latent.values():                       # the live rows change; the kept bytes must not
        arr[...] = 0
    dst = SeqState()
    kv.ensure(dst.pages, length)
    for layer in cfg.kda_layers:
        dst.kda_state[layer], dst.kda_conv[layer] = (x * 0 for x in (src.kda_state[layer], src.kda_conv[layer]))
    with cuda_double.counting() as c:
        kept.restore(7, dst)
    assert c.memcpys == len(pieces) and dst.length == length
    for k, v in snap.items():
        assert np.array_equal(ops.asnumpy(dst.kda_state[k]), v)
    assert dst.pages != src.pages                        # restored onto other pages
    got = [ops.asnumpy(kv.latent[l])[kv.rows(dst.pages, pos)] for l in cfg.dsa_layers]
    assert all(np.array_equal(bits(g), bits(b)) for g, b in zip(got, before))
    for layer in cfg.dsa_layers:
        rows = length % cfg.index_kpool
        for a, b in zip(dst.index_tail[layer], src.index_tail[layer]):
            assert np.array_equal(bits(ops.asnumpy(a))[:rows], bits(ops.asnumpy(b))[:rows])
    kept.drop(7)
    assert kept.pool.free_count == kept.pool.num_pages


def bits(a: np.ndarray) -> np.ndarray:
    """The bytes of an array (random bits hold NaNs, which compare unequal as values)."""
    return np.ascontiguousarray(a).view(np.uint8)


def kept_probe(kept, length):
    from cupyglm.kv.walk import Kept

    n = -(-kept.state_bytes(length) // kept.page_bytes)
    return Kept(kept.base, page_bytes=kept.page_bytes, pages=tuple(range(n)))


def test_shared_pages_are_not_copied_on_cuda_double(cuda_double):
    """CUPYGLM_KV_SHARE: a keep copies the fixed parts and the partly filled page only; a restore lends the whole
    pages and fills the rest, one memcpyAsync per piece."""
    from cupyglm.backend.cuda_ops import CudaOps
    from cupyglm.kv.kept import KeptStore
    from cupyglm.kv.store import KVStore

    cfg = preset("tiny")
    ops = CudaOps()
    kv = KVStore(cfg, ops, 8, cfg.page_tokens)
    length = 2 * cfg.page_tokens + 5
    src = _state(cfg, ops, kv, length, np.random.default_rng(2))
    kept, full = KeptStore(cfg, ops, kv, 1, 1 << 22, share=4), KeptStore(cfg, ops, kv, 1, 1 << 22)
    assert kept.shared_pages(length) == 2
    with cuda_double.counting() as c:
        entry = kept.keep(7, src, range(kept.pages_for(src.length)))
    kept.pages.hold(7, src.pages[:2])
    assert c.memcpy_bytes == entry.nbytes == kept.state_bytes(length) < full.state_bytes(length)
    pos = np.arange(length)
    before = [ops.asnumpy(kv.latent[l])[kv.rows(src.pages, pos)].copy() for l in cfg.dsa_layers]
    dst = SeqState(pages=kept.pages.lend(7))
    kv.ensure(dst.pages, length)
    for layer in cfg.kda_layers:
        dst.kda_state[layer], dst.kda_conv[layer] = (x * 0 for x in (src.kda_state[layer], src.kda_conv[layer]))
    with cuda_double.counting() as c:
        kept.restore(7, dst)
    assert c.memcpy_bytes == entry.nbytes and c.syncs == 0
    assert dst.pages[:2] == src.pages[:2] and dst.pages[2] != src.pages[2]
    assert [kv.pool.refcount(p) for p in src.pages] == [3, 3, 1]
    got = [ops.asnumpy(kv.latent[l])[kv.rows(dst.pages, pos)] for l in cfg.dsa_layers]
    assert all(np.array_equal(bits(g), bits(b)) for g, b in zip(got, before))
