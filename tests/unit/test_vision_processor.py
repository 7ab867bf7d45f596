"""The image processor: hand cases of the canvas rule, decoding (PNG, JPEG, WebP), the patch order, refusals;
and, where transformers is installed, value-for-value equality with its Glm5Next PIL image processor."""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from cupyglm.vision.processor import (CLIP_MEAN, CLIP_STD, ImageError, ProcessorConfig, canvas_size, content_size,
                                      decode_image, patchify, preprocess, process_bytes)

TINY = ProcessorConfig(min_image_tokens=16, max_image_tokens=64)

# (height, width, format, mode): sizes that resize differently: exact, upscaled, shrunk wide, shrunk tall, padded.
IMAGES = [(112, 112, "PNG", "RGB"), (20, 20, "PNG", "L"), (400, 640, "PNG", "RGBA"), (1080, 1920, "JPEG", "RGB"),
          (333, 97, "WEBP", "RGB"), (37, 250, "JPEG", "RGB")]


def encoded(h: int, w: int, fmt: str, mode: str = "RGB", seed: int = 0) -> bytes:
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    arr = np.random.default_rng(seed).integers(0, 256, (h, w, channels), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr[..., 0] if mode == "L" else arr, mode).save(buf, fmt)
    return buf.getvalue()


@pytest.mark.parametrize("hw, cfg, canvas, content", [
    ((112, 112), TINY, (112, 112), (112, 112)),            # exactly the minimum: kept
    ((20, 20), TINY, (112, 112), (112, 112)),              # below the minimum: scaled up to 16 tokens
    ((100, 100), TINY, (112, 112), (112, 112)),            # under 16 tokens of pixels: enlarged to the canvas
    ((130, 130), TINY, (140, 140), (130, 130)),            # rounded up to 28: padded, not enlarged
    ((1080, 1920), TINY, (168, 280), (157, 280)),          # above the maximum: shrunk, aspect kept, padded
    ((333, 97), TINY, (336, 112), (333, 97)),              # within budget: padded only
    ((1080, 1920), ProcessorConfig(), (1092, 1932), (1080, 1920)),   # the released budget (8000 tokens)
])
def test_canvas_and_content_sizes(hw, cfg, canvas, content):
    assert canvas_size(*hw, cfg) == canvas
    assert content_size(*hw, canvas, cfg) == content


def test_a_112_image_is_64_patches_and_16_tokens():
    out = process_bytes(encoded(112, 112, "PNG"), TINY)
    assert out.pixel_values.shape == (64, 1176) and out.pixel_values.dtype == np.float32
    assert out.grid == (1, 8, 8) and out.n_tokens == 16


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP"])
def test_each_format_decodes(fmt):
    img = decode_image(encoded(50, 70, fmt))
    assert img.format == fmt and img.size == (70, 50)


def test_transparency_is_laid_over_white():
    buf = io.BytesIO()
    Image.new("RGBA", (28, 28), (0, 0, 0, 0)).save(buf, "PNG")
    out = process_bytes(buf.getvalue(), ProcessorConfig(min_image_tokens=1, max_image_tokens=1))
    white = (np.float32(1.0) - np.asarray(CLIP_MEAN, np.float32)) / np.asarray(CLIP_STD, np.float32)
    assert np.array_equal(out.pixel_values.reshape(3, -1)[:, 0], white)


def test_patch_order_is_merge_blocks_then_channel_time_y_x():
    cfg = ProcessorConfig(patch_size=2, temporal_patch_size=2, merge_size=2)
    x = np.arange(3 * 8 * 4, dtype=np.float32).reshape(3, 8, 4)          # grid 4 x 2 patches: two merge blocks
    out = patchify(x, cfg)
    assert out.grid == (1, 4, 2) and out.pixel_values.shape == (8, 3 * 2 * 2 * 2)
    row = out.pixel_values[5]                 # block 1 (patch rows 2-3), its patch (0, 1): pixels y 4-5, x 2-3
    assert np.array_equal(row.reshape(3, 2, 2, 2)[:, 0], x[:, 4:6, 2:4])
    assert np.array_equal(row.reshape(3, 2, 2, 2)[:, 1], x[:, 4:6, 2:4])   # the frame repeated over time


@pytest.mark.parametrize("data, match", [
    (b"not an image", "corrupt or unreadable"),
    (encoded(8, 8, "PNG")[:40], "corrupt or unreadable"),
    (encoded(8, 8, "GIF", "L"), "unsupported image format 'GIF'"),
])
def test_bad_images_are_refused(data, match):
    with pytest.raises(ImageError, match=match):
        process_bytes(data, TINY)


@pytest.mark.parametrize("raw, match", [
    ({"do_normalize": False}, "do_normalize"),
    ({"patch_expand_factor": 2}, "patch_expand_factor"),
    ({"min_image_tokens": 100, "max_image_tokens": 10}, "min_image_tokens"),
    ({"image_std": [1, 0, 1]}, "image_std"),
    ({"merge_size": 0}, "merge_size"),
])
def test_unsupported_preprocessor_configs_are_refused(raw, match):
    with pytest.raises(ImageError, match=match):
        ProcessorConfig.from_dict(raw)


def test_the_config_round_trips_and_is_checked_against_the_tower():
    from cupyglm.config import preset

    assert ProcessorConfig.from_dict(TINY.to_dict()) == TINY
    TINY.check_tower(preset("tiny").vision)
    with pytest.raises(ImageError, match="merge_size=3 disagrees with vision_config.spatial_merge_size"):
        ProcessorConfig(merge_size=3).check_tower(preset("tiny").vision)


@pytest.mark.parametrize("cfg", [TINY, ProcessorConfig()], ids=["tiny", "released"])
@pytest.mark.parametrize("h, w, fmt, mode", IMAGES)
def test_equal_to_transformers_pil_processor(h, w, fmt, mode, cfg):
    pil = pytest.importorskip("transformers.models.glm5_next.image_processing_pil_glm5_next")
    data = encoded(h, w, fmt, mode)
    ours = process_bytes(data, cfg)
    theirs = pil.Glm5NextImageProcessorPil(**cfg.to_dict())(Image.open(io.BytesIO(data)), return_tensors="np")
    assert theirs["image_grid_thw"].tolist() == [list(ours.grid)]
    assert theirs["pixel_values"].dtype == ours.pixel_values.dtype
    assert np.array_equal(theirs["pixel_values"], ours.pixel_values)


def test_preprocess_takes_a_decoded_image():
    img = Image.open(io.BytesIO(encoded(60, 90, "PNG")))
    assert np.array_equal(preprocess(img, TINY).pixel_values, process_bytes(encoded(60, 90, "PNG"), TINY).pixel_values)
