"""The tower's weights in host memory (CUPYGLM_VISION_HOST) on `--backend cuda` through the CuPy double: the device
holds two staging slots, not the tower; each encode copies every unit once on the stager's stream, ordered by
events (a wait and a release per unit), with no host sync; the rows equal the resident tower's bit for bit (the
merger's projections in pieces of output rows included)."""
from __future__ import annotations

import gc
import io

import numpy as np
from PIL import Image

import cupy_double
from cupy_double import copies
from cupy_double.fixtures import cuda_double_module, cuda_ops  # noqa: F401
from cupyglm.checkpoint.vision_weights import vision_weights
from cupyglm.memory import vision_arrays, total_bytes, storage_of
from cupyglm.vision.processor import ProcessorConfig, process_bytes
from cupyglm.vision.staging import padded, tower_units
from cupyglm.vision.tower import VisionTower


def _image(tiny_dir):
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(5).integers(0, 256, (56, 84, 3), dtype=np.uint8)).save(buf, "PNG")
    return process_bytes(buf.getvalue(), ProcessorConfig.from_dir(tiny_dir))


def _built(ops, cfg, weights, host):
    """(tower, device bytes its weights hold)."""
    gc.collect()                       # an earlier test's arrays freed mid-build would cut the difference
    at = cupy_double.in_use()
    tower = VisionTower(cfg, weights, ops, host=host)
    return tower, cupy_double.in_use() - at


def _encoded(ops, tower, img):
    with cupy_double.counting() as c:
        rows = tower.encode(img.pixel_values, img.grid)
    return ops.asnumpy(rows), c


def test_staged_tower_holds_two_units_and_equals_resident(cuda_ops, tiny_ckpt, tiny_dir):  # noqa: F811
    cfg, weights, img = tiny_ckpt.config.vision, vision_weights(tiny_ckpt), _image(tiny_dir)
    resident, resident_bytes = _built(cuda_ops, cfg, weights, host=False)
    staged, staged_bytes = _built(cuda_ops, cfg, weights, host=True)
    units = tower_units(cfg)
    piece = [[(hi - lo) * int(np.prod(weights[n].shape[1:])) for n, lo, hi in u] for u in units]
    unit_bytes = [2 * sum(padded(k) for k in u) for u in piece]       # pieces start 128-byte aligned
    st = storage_of(cuda_ops)
    assert resident_bytes == 2 * sum(map(sum, piece)) == total_bytes(vision_arrays(tiny_ckpt.config, host=False), st)
    assert staged_bytes == 2 * max(unit_bytes) == total_bytes(vision_arrays(tiny_ckpt.config, host=True), st)
    assert staged_bytes < resident_bytes

    want, plain = _encoded(cuda_ops, resident, img)
    copies.LAST_STREAMS.clear()
    got, c = _encoded(cuda_ops, staged, img)
    assert got.tobytes() == want.tobytes()
    assert c.memcpys == len(units) and c.memcpy_bytes == sum(unit_bytes)
    assert set(copies.LAST_STREAMS) == {staged.weights.stager.stream.ptr} != {0}   # on the copy stream
    assert c.event_waits == c.event_records == 2 * len(units)       # a copy waits a release; compute waits a copy
    split = len(units) - (cfg.depth + 3)                   # the merger's gate/up and down pieces
    assert c.syncs == plain.syncs == 0
    swiglu = sum(any(n == "merger.gate_proj.weight" for n, _, _ in u) for u in units)   # gate/up pieces
    # + a concatenate each; a SwiGLU piece's prompt rows are three launches (two gemm_tc, swiglu), not one
    assert c.launches == plain.launches + split - 2 + 2 * (swiglu - 1) and c.kernels >= plain.kernels + 2
    assert plain.memcpys == plain.event_waits == plain.event_records == 0
