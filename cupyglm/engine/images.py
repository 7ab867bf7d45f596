"""Images in a prompt: what a request carries (`ImageInput`: its preprocessed pixels and where its placeholders
sit), the tower's rows rank 0 computes when the request is admitted (`ImageEncoder`), and the rows a prompt chunk
takes (`chunk_rows`).

The merged rows replace the embeddings of the image's placeholder tokens one for one (`cupyglm.vision.tower`);
the placeholders stay in the prompt's token ids, and positions stay the ordinary sequential ones. Rank 0 encodes
each image alone (its rows depend on that image only), and the step message carries the rows to every rank
(`cupyglm.engine.ops.image`), so no other rank needs the tower. A prompt with images is neither kept nor restored
by the prompt cache (`cupyglm.engine.prefix_store`): its token ids alone do not name its state.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from cupyglm.backend.lanes import BF16


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


class ImageEncoder:
    """Rank 0's tower on its backend: an admitted request's images -> ((start, bf16 rows [n, D] on the host), ...)."""

    def __init__(self, tower, ops):
        self.tower, self.ops = tower, ops

    def rows(self, images) -> tuple[tuple[int, np.ndarray], ...]:
        out = []
        for im in images:
            rows = np.asarray(self.ops.asnumpy(self.tower.encode(im.pixel_values, im.grid)))
            if rows.shape[0] != im.n_tokens:
                raise ValueError(f"the tower gave {rows.shape[0]} rows for {im.n_tokens} image placeholders")
            out.append((im.start, np.ascontiguousarray(rows.astype(BF16))))
        return tuple(out)


def chunk_rows(images, start: int, count: int) -> tuple[tuple[int, np.ndarray], ...]:
    """The image rows of positions [start, start + count) as (offset in the chunk, rows): a chunk may hold part of an
    image, its rows then the matching slice."""
    out = []
    for at, rows in images:
        lo, hi = max(at, start), min(at + rows.shape[0], start + count)
        if lo < hi:
            out.append((lo - start, rows[lo - at:hi - at]))
    return tuple(out)
