"""The tower's weights staged from host memory (CUPYGLM_VISION_HOST) on numpy: the units cover every tensor once in
the order encode reads them, two slots of the largest unit hold them (what the memory plan counts), the rows equal
the resident tower's bit for bit, and a pass that reads past its units is refused."""
from __future__ import annotations

import dataclasses
import io

import numpy as np
import pytest
from PIL import Image

from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.checkpoint.names import VISION_PREFIX, vision_specs
from cupyglm.checkpoint.vision_weights import vision_weights
from cupyglm.config import preset
from cupyglm.memory import storage_of, total_bytes, vision_arrays, vision_host_arrays
from cupyglm.vision.processor import ProcessorConfig, process_bytes
from cupyglm.vision.staging import StagedWeights, tower_shapes, tower_units
from cupyglm.vision.tower import VisionTower


def png(h: int, w: int, seed: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def test_units_cover_every_tensor_once():
    for name in ("tiny", "glm-5.3-flash"):
        cfg = preset(name)
        specs = {s.name[len(VISION_PREFIX):]: s.shape for s in vision_specs(cfg)}
        assert tower_shapes(cfg.vision) == {n: (s[0], int(np.prod(s[1:]))) if len(s) > 1 else s
                                            for n, s in specs.items()}
        rows = {}
        for unit in tower_units(cfg.vision):
            for n, lo, hi in unit:
                assert lo == rows.get(n, 0) < hi                    # a split tensor's pieces in row order
                rows[n] = hi
        assert rows == {n: s[0] for n, s in specs.items()}          # every tensor, every row, once


def test_flash_plan_counts_two_slots_not_the_tower():
    cfg, st = preset("glm-5.3-flash"), storage_of(NumpyOps())
    tower, slots = total_bytes(vision_arrays(cfg), st), total_bytes(vision_arrays(cfg, host=True), st)
    assert tower == total_bytes(vision_host_arrays(cfg), st) and round(tower / 2**30, 2) == 1.05
    block = 3 * 1024 * 1024 + 1024 * 1024 + 3 * 4096 * 1024 + 3 * 1024 + 1024 + 2 * 4096 + 1024 + 2 * 1024 + 2 * 64
    assert slots == 2 * 2 * block                                # a block is the largest unit
    assert round((tower - slots) / 2**30, 2) == 0.99
    assert vision_arrays(dataclasses.replace(cfg, vision=None), host=True) == []            # a text-only model


def test_staged_rows_equal_resident(tiny_ckpt, tiny_dir):
    cfg, weights = tiny_ckpt.config.vision, vision_weights(tiny_ckpt)
    img = process_bytes(png(112, 150, 4), ProcessorConfig.from_dir(tiny_dir))
    resident = VisionTower(cfg, weights)
    staged = VisionTower(cfg, weights, host=True)
    assert isinstance(staged.weights, StagedWeights)
    slots = staged.weights.stager.slots
    assert sum(s.nbytes for s in slots) == total_bytes(vision_arrays(tiny_ckpt.config, host=True),
                                                       storage_of(NumpyOps()))
    for i, view in enumerate(staged.weights.views):                 # each piece 128-byte aligned in its slot
        assert all((v.ctypes.data - slots[i % 2].ctypes.data) % 128 == 0 for v in view.values())
    want = resident.encode(img.pixel_values, img.grid)
    assert staged.encode(img.pixel_values, img.grid).tobytes() == want.tobytes()
    assert staged.encode(img.pixel_values, img.grid).tobytes() == want.tobytes()     # a second pass alike


def test_a_pass_past_its_units_is_refused(tiny_ckpt):
    staged = VisionTower(tiny_ckpt.config.vision, vision_weights(tiny_ckpt), host=True)
    p = staged.weights.begin()
    for _ in tower_units(tiny_ckpt.config.vision):
        p.next()
    with pytest.raises(ValueError, match="reads .* units"):
        p.next()
    p.end()
    assert np.isfinite(np.asarray(staged.weights.stager.host[:8], np.float32)).all()
