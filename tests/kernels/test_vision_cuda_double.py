"""The vision tower on `--backend cuda` through the CuPy double (NVRTC cubins, CuPy's launch rules, the emulator
running them): its rows equal the numpy reference's bit for bit, every op it calls has a kernel."""
from __future__ import annotations

import io

import numpy as np
from PIL import Image

from cupy_double.fixtures import cuda_double_module, cuda_ops  # noqa: F401
from cupyglm.checkpoint.vision_weights import vision_weights
from cupyglm.vision.processor import ProcessorConfig, process_bytes
from cupyglm.vision.tower import VisionTower


def test_the_tower_on_cuda_equals_numpy(cuda_ops, tiny_ckpt, tiny_dir):  # noqa: F811
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(5).integers(0, 256, (56, 84, 3), dtype=np.uint8)).save(buf, "PNG")
    img = process_bytes(buf.getvalue(), ProcessorConfig.from_dir(tiny_dir))
    weights = vision_weights(tiny_ckpt)
    want = VisionTower(tiny_ckpt.config.vision, weights).encode(img.pixel_values, img.grid)
    got = cuda_ops.asnumpy(VisionTower(tiny_ckpt.config.vision, weights, cuda_ops).encode(img.pixel_values, img.grid))
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()
