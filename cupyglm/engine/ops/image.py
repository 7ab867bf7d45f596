"""Image: the tower's rows of an admitted request's images (rank 0 encodes them; `cupyglm.engine.images`), sent
once, right after the admit that names the request. Rows are bf16 bit patterns, each image's n_rows x width; the
tag (`images.image_tag`, zeros: none) names the image for the prompt cache's keys on every rank.

Apply: the rows are held with the request (dropped with it by cancel); a prompt chunk over an image's placeholder
positions takes them in place of those tokens' embeddings (`cupyglm.engine.ops.run`).
"""
from __future__ import annotations

import dataclasses
import struct

import numpy as np

from cupyglm.backend.lanes import BF16
from cupyglm.distributed.step import Reader, StepFormatError, pack
from cupyglm.engine.images import TAG_BYTES
from cupyglm.engine.ops.fields import COUNT

TAG = 15
NAME = "image"
LAYOUT = ("n u32 | n x (request_id u64 | start u32 | n_rows u32 | width u32 | tag u8 x 32 | "
          "rows bf16 x n_rows x width)",)
_ENTRY = struct.Struct("<QIII")


@dataclasses.dataclass(frozen=True, eq=False)
class Image:
    entries: tuple[tuple[int, int, np.ndarray, bytes], ...]   # (request, first placeholder, rows [n, D] bf16, tag)

    def encode(self) -> bytes:
        out = bytearray(pack(COUNT, len(self.entries)))
        for rid, start, rows, tag in self.entries:
            if rows.ndim != 2 or rows.dtype != BF16:
                raise ValueError(f"request {rid}'s image rows must be 2-D bf16, got {rows.dtype} {rows.shape}")
            if len(tag) not in (0, TAG_BYTES):
                raise ValueError(f"request {rid}'s image tag has {len(tag)} bytes, not {TAG_BYTES}")
            out += pack(_ENTRY, rid, start, rows.shape[0], rows.shape[1])
            out += bytes(tag) or bytes(TAG_BYTES)
            out += np.ascontiguousarray(rows).view(np.uint16).astype("<u2").tobytes()
        return bytes(out)

    @classmethod
    def decode(cls, payload) -> Image:
        r = Reader(payload, NAME)
        (n,) = r.take(COUNT, "the image count")
        out = []
        for _ in range(n):
            rid, start, n_rows, width = r.take(_ENTRY, "an image")
            tag = bytes(r.rest(TAG_BYTES, f"request {rid}'s image tag"))
            raw = r.rest(2 * n_rows * width, f"request {rid}'s image rows")
            rows = np.frombuffer(raw, dtype="<u2").astype(np.uint16).view(BF16).reshape(n_rows, width)
            out.append((rid, start, rows, b"" if tag == bytes(TAG_BYTES) else tag))
        r.done()
        return cls(tuple(out))

    def apply(self, w, result) -> None:
        for rid, start, rows, tag in self.entries:
            if rid not in w.requests:
                raise StepFormatError(f"step {w.step}: image rows for unknown request {rid}")
            if start + rows.shape[0] > len(w.requests[rid].prompt):
                raise StepFormatError(f"step {w.step}: request {rid}'s image rows [{start}, "
                                      f"{start + rows.shape[0]}) pass its prompt's end")
            w.images.setdefault(rid, []).append((start, rows, tag))


OP = Image
