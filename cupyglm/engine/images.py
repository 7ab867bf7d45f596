"""Images in a prompt: what a request carries (`ImageInput`: its preprocessed pixels and where its placeholders
sit), the tower's rows rank 0 computes when the request is admitted (`ImageEncoder`), and the rows a prompt chunk
takes (`chunk_rows`).

The merged rows replace the embeddings of the image's placeholder tokens one for one (`cupyglm.vision.tower`);
the placeholders stay in the prompt's token ids, and positions stay the ordinary sequential ones. Rank 0 encodes
each image alone (its rows depend on that image only), and the step message carries the rows to every rank
(`cupyglm.engine.ops.image`), so no other rank needs the tower.

The prompt cache keys an image prompt by `cache_tokens`: each image's placeholder run is replaced by keys drawn
from the image's tag (a digest of its bytes and the grid it was resized to), for lookup only; the tokens fed to
the model stay the placeholders. Two different images never share a key run, and every rank derives the same keys
(the image op carries the tag), so the disk tier's files are named by them too. An image without a digest is
neither kept nor restored.
"""
from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from cupyglm.backend.lanes import BF16

KEY_BIT = 1 << 31                        # image keys have it set: no vocabulary reaches it, so no token equals one
TAG_BYTES = 32


@dataclasses.dataclass(frozen=True, eq=False)
class ImageInput:
    start: int                            # prompt position of the image's first placeholder token
    pixel_values: np.ndarray              # float32 [grid_h * grid_w, 3 * t * p * p] (vision.processor)
    grid: tuple[int, int, int]            # (t, grid_h, grid_w)
    n_tokens: int                         # placeholder tokens = rows the tower gives
    digest: bytes = b""                   # SHA-256 of the image's bytes (logs and tests name an image by it)

    @property
    def end(self) -> int:
        return self.start + self.n_tokens


def check_images(prompt: tuple[int, ...], images, image_token_id: int | None) -> tuple[ImageInput, ...]:
    """`images` in prompt order, each over a run of placeholder tokens inside the prompt; ValueError otherwise."""
    images = tuple(images)
    if not images:
        return ()
    if image_token_id is None:
        raise ValueError("images given, but this engine runs no vision tower")
    at = 0
    for i, im in enumerate(images):
        if im.start < at or im.end > len(prompt) or im.n_tokens < 1:
            raise ValueError(f"image {i}'s placeholders [{im.start}, {im.end}) overlap another image's or lie "
                             f"outside the prompt of {len(prompt)} tokens")
        if any(t != image_token_id for t in prompt[im.start:im.end]):
            raise ValueError(f"image {i}'s positions [{im.start}, {im.end}) are not all image placeholder tokens "
                             f"({image_token_id})")
        at = im.end
    n_placeholders = sum(1 for t in prompt if t == image_token_id)
    if n_placeholders != sum(im.n_tokens for im in images):
        raise ValueError(f"the prompt has {n_placeholders} image placeholder tokens for "
                         f"{sum(im.n_tokens for im in images)} image rows")
    return images


def image_tag(im: ImageInput) -> bytes:
    """The 32 bytes naming an image's rows: its bytes' digest and its grid (a resize changes the rows); b"" when
    the image has no digest."""
    if not im.digest:
        return b""
    return hashlib.sha256(bytes(im.digest) + np.asarray(im.grid, dtype="<u4").tobytes()).digest()


def cache_tokens(prompt, spans) -> tuple[int, ...] | None:
    """The prompt as the prompt cache keys it: each (start, n_tokens, tag) span's placeholders replaced by n keys
    drawn from the tag; None when a span has no tag (such a prompt is not kept)."""
    out = list(prompt)
    for start, n, tag in spans:
        if not tag:
            return None
        raw = np.frombuffer(hashlib.shake_256(tag).digest(4 * n), dtype="<u4")
        out[start:start + n] = (raw | np.uint32(KEY_BIT)).tolist()
    return tuple(out)


def request_key(prompt, images) -> tuple[int, ...] | None:
    """Rank 0: `cache_tokens` of a prompt and its ImageInputs."""
    return cache_tokens(prompt, [(im.start, im.n_tokens, image_tag(im)) for im in images])


def held_key(prompt, held) -> tuple[int, ...] | None:
    """Any rank: `cache_tokens` of a prompt and the (start, rows, tag) the image op gave it."""
    return cache_tokens(prompt, [(start, rows.shape[0], tag) for start, rows, tag in held])


class ImageEncoder:
    """Rank 0's tower on its backend: an admitted request's images -> ((start, bf16 rows [n, D] on the host,
    tag), ...)."""

    def __init__(self, tower, ops):
        self.tower, self.ops = tower, ops

    def rows(self, images) -> tuple[tuple[int, np.ndarray], ...]:
        out = []
        for im in images:
            rows = np.asarray(self.ops.asnumpy(self.tower.encode(im.pixel_values, im.grid)))
            if rows.shape[0] != im.n_tokens:
                raise ValueError(f"the tower gave {rows.shape[0]} rows for {im.n_tokens} image placeholders")
            out.append((im.start, np.ascontiguousarray(rows.astype(BF16)), image_tag(im)))
        return tuple(out)


def chunk_rows(images, start: int, count: int) -> tuple[tuple[int, np.ndarray], ...]:
    """The image rows of positions [start, start + count) as (offset in the chunk, rows): a chunk may hold part of an
    image, its rows then the matching slice."""
    out = []
    for at, rows, *_ in images:
        lo, hi = max(at, start), min(at + rows.shape[0], start + count)
        if lo < hi:
            out.append((lo - start, rows[lo - at:hi - at]))
    return tuple(out)
