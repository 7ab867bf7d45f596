"""The vision tower through the ops interface: numpy and sim give the same rows bit for bit on the tiny
checkpoint (two images of different sizes, encoded in one call), an image's rows do not depend on the images
beside it, and erf_f32 (the GELU's erf shared by host and kernels) is accurate and has the .cuh's constants."""
from __future__ import annotations

import io
import math
import re

import numpy as np
import pytest
from PIL import Image

from cupyglm.backend.erf_f32 import CF_DEPTH, TAYLOR, erf_f32
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.backend.sim_ops import SimOps
from cupyglm.checkpoint.vision_weights import vision_weights
from cupyglm.kernels import CUDA_SRC
from cupyglm.vision.processor import ProcessorConfig, process_bytes
from cupyglm.vision.tower import VisionTower


def _image(h: int, w: int, seed: int, proc):
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, "PNG")
    img = process_bytes(buf.getvalue(), proc)
    return img.pixel_values, img.grid


@pytest.fixture(scope="module")
def images(tiny_dir):
    proc = ProcessorConfig.from_dir(tiny_dir)
    return [_image(112, 150, 3, proc), _image(60, 200, 4, proc)]


@pytest.fixture(scope="module")
def numpy_rows(tiny_ckpt, images):
    return VisionTower(tiny_ckpt.config.vision, vision_weights(tiny_ckpt)).encode_images(images)


def test_numpy_and_sim_rows_are_bit_identical_for_two_image_sizes(tiny_ckpt, images, numpy_rows):
    assert images[0][1] != images[1][1]
    sim = VisionTower(tiny_ckpt.config.vision, vision_weights(tiny_ckpt), SimOps())
    rows = [sim.ops.asnumpy(r) for r in sim.encode_images(images)]
    for a, b in zip(numpy_rows, rows):
        assert a.dtype == b.dtype == np.dtype("bfloat16") and a.shape == b.shape
        assert a.tobytes() == b.tobytes()


def test_an_image_rows_are_the_same_alone_batched_and_again(tiny_ckpt, images, numpy_rows):
    tower = VisionTower(tiny_ckpt.config.vision, vision_weights(tiny_ckpt), NumpyOps())
    alone = tower.encode(*images[1])
    assert alone.tobytes() == numpy_rows[1].tobytes()
    swapped = tower.encode_images(images[::-1])
    assert [r.tobytes() for r in swapped] == [r.tobytes() for r in numpy_rows[::-1]]


def test_erf_f32_is_within_half_a_microunit_of_erf():
    x = np.linspace(-6.0, 6.0, 120001, dtype=np.float32)
    want = np.array([math.erf(float(v)) for v in x])
    assert np.abs(erf_f32(x).astype(np.float64) - want).max() < 3e-7
    assert np.isnan(erf_f32(np.float32(np.nan))) and erf_f32(np.float32(np.inf)) == 1.0


def test_erf_f32_twin_has_the_cuh_constants():
    src = (CUDA_SRC / "erf_f32.cuh").read_text()
    block = src[src.index("const float C["):src.index("};")]
    consts = [np.float32(float.fromhex(h.rstrip("f"))) for h in re.findall(r"-?0x[0-9a-f.]+p[-+]\d+f", block)]
    assert consts == list(TAYLOR)
    assert f"#define ERF_TAYLOR_TERMS {len(TAYLOR)}" in src and f"#define ERF_CF_DEPTH {CF_DEPTH}" in src


def test_vision_launchers_refuse_wrong_calls_naming_the_parameter():
    from cupyglm.kernels import ops_vision
    from cupyglm.kernels.ops import Kernels

    k = Kernels("sim", np)
    bf = np.dtype("bfloat16")
    qkv, w = np.zeros((4, 3, 2, 8), bf), np.ones(8, bf)
    table = np.zeros((4, 8), np.float32)
    with pytest.raises(ValueError, match="cos must have shape"):
        ops_vision.vision_attention(k, qkv, w, w, 1e-5, table[:3], table, 0.5)
    with pytest.raises(ValueError, match="head_dim must be even"):
        ops_vision.vision_attention(k, np.zeros((4, 3, 2, 7), bf), w[:7], w[:7], 1e-5, table[:, :7], table[:, :7], 1.0)
    n = ops_vision.MAX_PATCHES + 1
    with pytest.raises(ValueError, match=f"at most {n - 1} patches"):
        ops_vision.vision_attention(k, np.zeros((n, 3, 1, 2), bf), w[:2], w[:2], 1e-5, np.zeros((n, 2), np.float32),
                                    np.zeros((n, 2), np.float32), 1.0)
    with pytest.raises(ValueError, match="parameter b must be bfloat16"):
        ops_vision.bias_add(k, np.zeros((2, 8), np.float32), np.zeros(8, np.float32))
    with pytest.raises(ValueError, match="out must be one of"):
        ops_vision.bias_add(k, np.zeros((2, 8), np.float32), w, "f16")
