"""The image processor: encoded image bytes -> the tower's pixel rows and patch grid, as the checkpoint's
preprocessor_config.json (Hugging Face's Glm5NextImageProcessor) defines them.

Steps, each as the published processor runs it (so its PIL variant's output equals this one value for value):
1. Decode with Pillow (PNG, JPEG, WebP); a picture with transparency is laid over white, then RGB.
2. The canvas: with f = patch_size * merge_size and t = temporal_patch_size, a token costs t * f^2 pixels; the
   canvas is (h, w) rounded up to multiples of f; below min_image_tokens it is scaled up (sqrt of the budget
   ratio, then rounded up to f); above max_image_tokens the largest content height whose aspect-kept canvas
   fits is searched (binary search over the content height, width floor(w * ch / h), both rounded up to f).
3. The content: the image scaled by min(canvas_h / h, canvas_w / w) (never up unless the image is below the
   minimum budget), floored, resized with Pillow's resample filter (bicubic), then zero-padded bottom and
   right to the canvas (the padding is normalised like any black pixel).
4. Rescale (x * rescale_factor in float64, then float32), normalise ((x - mean) / std in float32, CLIP's
   mean and std).
5. Patches in the order the tower merges them: 2x2 blocks of patches, block rows then block columns, the
   patches of a block row-major; each patch flattened (channel, time, y, x) with the one frame repeated over
   the t temporal slots -> pixel_values [grid_h * grid_w, 3 * t * p * p]; grid (1, grid_h, grid_w);
   the text model sees grid_h * grid_w / merge^2 image tokens.
"""
from __future__ import annotations

import dataclasses
import io
import json
import math
from pathlib import Path

import numpy as np
from PIL import Image

PREPROCESSOR_FILE = "preprocessor_config.json"
FORMATS = ("PNG", "JPEG", "WEBP")
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
BICUBIC = 3                                          # PIL's resample code; the published processor's filter


class ImageError(ValueError):
    """An image that cannot be decoded or processed, or a preprocessor_config.json the code does not run."""


@dataclasses.dataclass(frozen=True)
class ProcessorConfig:
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_image_tokens: int = 16
    max_image_tokens: int = 8000
    image_mean: tuple[float, float, float] = CLIP_MEAN
    image_std: tuple[float, float, float] = CLIP_STD
    rescale_factor: float = 1 / 255
    resample: int = BICUBIC

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @classmethod
    def from_dict(cls, raw: dict) -> "ProcessorConfig":
        if not isinstance(raw, dict):
            raise ImageError(f"{PREPROCESSOR_FILE}: not a JSON object")
        for field in ("do_resize", "do_rescale", "do_normalize", "do_convert_rgb"):
            if raw.get(field, True) is not True:
                raise ImageError(f"{PREPROCESSOR_FILE}: unsupported {field}={raw[field]!r} (supported: true)")
        if raw.get("patch_expand_factor", 1) != 1:
            raise ImageError(f"{PREPROCESSOR_FILE}: unsupported patch_expand_factor={raw['patch_expand_factor']!r} "
                             "(supported: 1)")
        known = {f.name for f in dataclasses.fields(cls)}
        cfg = cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items() if k in known})
        cfg.check()
        return cfg

    @classmethod
    def from_dir(cls, path: str | Path) -> "ProcessorConfig":
        f = Path(path) / PREPROCESSOR_FILE
        try:
            raw = json.loads(f.read_text())
        except FileNotFoundError:
            raise ImageError(f"{f}: missing (the checkpoint has no image processor)") from None
        except json.JSONDecodeError as e:
            raise ImageError(f"{f}: not valid JSON ({e})") from None
        return cls.from_dict(raw)

    def check(self) -> None:
        for field in ("patch_size", "temporal_patch_size", "merge_size", "min_image_tokens", "max_image_tokens"):
            v = getattr(self, field)
            if not isinstance(v, int) or v <= 0:
                raise ImageError(f"{PREPROCESSOR_FILE}: {field} must be a positive integer, got {v!r}")
        if self.min_image_tokens > self.max_image_tokens:
            raise ImageError(f"{PREPROCESSOR_FILE}: min_image_tokens {self.min_image_tokens} exceeds "
                             f"max_image_tokens {self.max_image_tokens}")
        for field in ("image_mean", "image_std"):
            v = getattr(self, field)
            if len(v) != 3 or (field == "image_std" and min(v) <= 0):
                raise ImageError(f"{PREPROCESSOR_FILE}: {field} must be three numbers (RGB), std positive")

    def capped(self, max_tokens: int) -> "ProcessorConfig":
        """This processor with at most `max_tokens` tokens an image (--vision-image-tokens; 0: as it is): a larger
        image is resized to fit, as the published processor resizes to its own maximum."""
        if not max_tokens or max_tokens >= self.max_image_tokens:
            return self
        if max_tokens < self.min_image_tokens:
            raise ImageError(f"--vision-image-tokens {max_tokens} is below the checkpoint's min_image_tokens "
                             f"{self.min_image_tokens} ({PREPROCESSOR_FILE})")
        return dataclasses.replace(self, max_image_tokens=max_tokens)

    def to_dict(self) -> dict:
        return {"image_processor_type": "Glm5NextImageProcessor", "processor_class": "Glm5NextProcessor",
                "do_resize": True, "do_rescale": True, "do_normalize": True, "do_convert_rgb": True,
                **{k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}}

    def check_tower(self, vision) -> None:
        """The processor and the tower (a VisionConfig) agree on the patch geometry."""
        for mine, theirs in (("patch_size", "patch_size"), ("temporal_patch_size", "temporal_patch_size"),
                             ("merge_size", "spatial_merge_size")):
            if getattr(self, mine) != getattr(vision, theirs):
                raise ImageError(f"{PREPROCESSOR_FILE}: {mine}={getattr(self, mine)} disagrees with "
                                 f"vision_config.{theirs}={getattr(vision, theirs)}")


@dataclasses.dataclass(frozen=True)
class ProcessedImage:
    pixel_values: np.ndarray              # float32 [grid_h * grid_w, 3 * t * p * p], in the tower's merge order
    grid: tuple[int, int, int]            # (t, grid_h, grid_w) in patches; t is 1 for an image
    n_tokens: int                         # image placeholder tokens: grid_h * grid_w / merge^2


def decode_image(data: bytes) -> Image.Image:
    """Pillow's decode of PNG, JPEG or WebP bytes, fully loaded; anything else is an ImageError."""
    try:
        img = Image.open(io.BytesIO(data))
        if img.format not in FORMATS:
            raise ImageError(f"unsupported image format {img.format!r} (supported: PNG, JPEG, WebP)")
        img.load()
    except ImageError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise ImageError(f"image too large to decode ({e})") from None
    except Exception as e:                               # Pillow raises many kinds on corrupt data
        raise ImageError(f"corrupt or unreadable image ({type(e).__name__}: {e})") from None
    return img


def to_rgb(img: Image.Image) -> Image.Image:
    if "A" in img.getbands() or img.info.get("transparency") is not None:
        rgba = img.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    return img.convert("RGB")


def canvas_size(height: int, width: int, cfg: ProcessorConfig) -> tuple[int, int]:
    """The padded canvas (multiples of patch_size * merge_size) within the min/max token budget."""
    f, t = cfg.factor, cfg.temporal_patch_size
    lo, hi = cfg.min_image_tokens * t * f * f, cfg.max_image_tokens * t * f * f

    def up(v: int) -> int:
        return -(-v // f) * f

    ch, cw = up(height), up(width)
    if t * ch * cw < lo:
        s = math.sqrt(lo / (t * height * width))
        ch, cw = up(max(1, math.ceil(height * s))), up(max(1, math.ceil(width * s)))
    if t * ch * cw > hi:
        if hi < t * f * f:
            raise ImageError(f"max_image_tokens {cfg.max_image_tokens} leaves no room for one patch block")
        ch, cw, a, b = f, f, 1, height
        while a <= b:                                # the largest content height whose canvas fits
            mid = (a + b) // 2
            h2, w2 = up(mid), up(max(1, math.floor(width * mid / height)))
            if t * h2 * w2 <= hi:
                ch, cw, a = h2, w2, mid + 1
            else:
                b = mid - 1
    return ch, cw


def content_size(height: int, width: int, canvas: tuple[int, int], cfg: ProcessorConfig) -> tuple[int, int]:
    """The resized image's size inside the canvas: aspect kept, never enlarged unless below the token minimum."""
    f, t = cfg.factor, cfg.temporal_patch_size
    scale = min(canvas[0] / height, canvas[1] / width)
    if t * height * width >= t * f * f * cfg.min_image_tokens:
        scale = min(1.0, scale)
    return (max(1, min(canvas[0], math.floor(height * scale))),
            max(1, min(canvas[1], math.floor(width * scale))))


def preprocess(img: Image.Image, cfg: ProcessorConfig) -> ProcessedImage:
    """One decoded image -> its pixel rows and grid (steps 2-5 of the module docstring)."""
    rgb = to_rgb(img)
    width, height = rgb.size
    canvas = canvas_size(height, width, cfg)
    ch, cw = content_size(height, width, canvas, cfg)
    if (ch, cw) != (height, width):
        rgb = rgb.resize((cw, ch), resample=cfg.resample)
    pixels = np.zeros((3, canvas[0], canvas[1]), np.uint8)
    pixels[:, :ch, :cw] = np.asarray(rgb).transpose(2, 0, 1)
    x = (pixels.astype(np.float64) * cfg.rescale_factor).astype(np.float32)
    x = (x - np.asarray(cfg.image_mean, np.float32)[:, None, None]) / np.asarray(cfg.image_std, np.float32)[:, None, None]
    return patchify(x, cfg)


def patchify(x: np.ndarray, cfg: ProcessorConfig) -> ProcessedImage:
    """[3, H, W] float32 -> rows in merge-block order, each (channel, time, y, x) with the frame repeated."""
    p, m, t = cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size
    c, h, w = x.shape
    gh, gw = h // p, w // p
    blocks = x.reshape(c, gh // m, m, p, gw // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)   # (bh, bw, mh, mw, c, y, x)
    frames = np.broadcast_to(blocks[:, :, :, :, :, None], blocks.shape[:5] + (t, p, p))
    rows = np.ascontiguousarray(frames.reshape(gh * gw, c * t * p * p))
    return ProcessedImage(rows, (1, gh, gw), gh * gw // (m * m))


def process_bytes(data: bytes, cfg: ProcessorConfig) -> ProcessedImage:
    return preprocess(decode_image(data), cfg)
