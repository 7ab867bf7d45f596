"""Image parts of chat messages: checked where the request is parsed (`image_part`: a `data:` or http(s) URL, the
count within --vision-max-images), fetched, decoded and preprocessed in the worker pool (`ImagePrep.prompt`: Pillow,
then the checkpoint's image processor, capped by --vision-image-tokens), and the prompt's one placeholder per
image repeated once per merged image row.

Remote URLs are refused unless --vision-urls (then `cupyglm.server.image_fetch` fetches them: public addresses
only, size and time limits). Every refusal is a 400 naming the part and the problem: a bad data URL, base64 that
does not decode, a remote URL refused or unfetchable, a corrupt image, an unsupported format, a decompression bomb
(Pillow's pixel limit), too many images.
"""
from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
from typing import Any

from cupyglm.engine.images import ImageInput
from cupyglm.server.errors import ApiError, bad
from cupyglm.server.image_fetch import FetchError
from cupyglm.server.fields import json_kind
from cupyglm.vision.processor import ImageError, ProcessorConfig, process_bytes

IMAGE_TYPES = ("image_url", "image")


def image_part(pp: str, part: dict) -> dict:
    """An image part (`pp` names it) as the template renders it, holding its data URL: {"type": "image_url",
    "url": ..., "param": pp}."""
    raw = part.get("image_url", part.get("image"))
    url = raw.get("url") if isinstance(raw, dict) else raw
    if not isinstance(url, str):
        raise bad(f"{pp}.image_url", f"'{pp}.image_url' must be an object with a string 'url', got {json_kind(raw)}",
                  "invalid_type")
    if url.startswith(("http://", "https://")):
        return {"type": "image_url", "url": url, "param": pp}         # fetched (or refused) in the worker pool
    head, comma, _ = url.partition(",")
    if not url.startswith("data:") or not comma or not head.endswith(";base64"):
        scheme = url.split(":", 1)[0] if ":" in url else url[:16]
        raise bad(f"{pp}.image_url", f"'{pp}.image_url' must be a data: URL with base64 data "
                  f"(data:image/png;base64,...), got one starting {scheme[:16]!r}")
    if not head[len("data:"):].startswith("image/"):
        raise bad(f"{pp}.image_url", f"'{pp}.image_url' has media type {head[5:-7]!r}; an image is image/png, "
                  "image/jpeg or image/webp")
    return {"type": "image_url", "url": url, "param": pp}


def image_parts(messages: list[dict]) -> list[dict]:
    """The image parts of checked messages, in the order the template renders them."""
    return [p for m in messages if isinstance(m.get("content"), list)
            for p in m["content"] if isinstance(p, dict) and p.get("type") == "image_url"]


def count_images(messages: list[dict], max_images: int) -> int:
    """The image parts of `messages`; more than `max_images` (0: this server serves no images) is a 400."""
    n = len(image_parts(messages))
    if n > max_images:
        raise bad("messages", f"too many images: the request holds {n}, this server takes at most {max_images} "
                  "per request (--vision-max-images)")
    return n


@dataclasses.dataclass(frozen=True)
class ImagePrep:
    """The server's image side: the checkpoint's processor and the placeholder token's id."""

    processor: ProcessorConfig
    image_token_id: int
    fetcher: Any = None                   # image_fetch.Fetcher with --vision-urls; None: remote URLs refused

    def data(self, part: dict) -> bytes:
        """The image bytes of one part: its data URL's, or its remote URL's fetched; a 400 naming the part."""
        pp, url = part["param"], part["url"]
        if not url.startswith(("http://", "https://")):
            try:
                return base64.b64decode(url.partition(",")[2], validate=True)
            except (binascii.Error, ValueError):
                raise bad(f"{pp}.image_url", f"'{pp}.image_url': the data URL's base64 does not decode") from None
        if self.fetcher is None:
            raise bad(f"{pp}.image_url", f"'{pp}.image_url': remote image URLs are refused (this server fetches "
                      "them only with --vision-urls); send the image inline as a data: URL "
                      "(data:image/png;base64,...)", "unsupported_parameter")
        try:
            return self.fetcher.fetch(url)
        except FetchError as e:
            raise bad(f"{pp}.image_url", f"'{pp}.image_url': {e}") from None

    def decode(self, part: dict):
        """(processed image, SHA-256 of its bytes) of one image part; a 400 naming the part otherwise."""
        pp = part["param"]
        data = self.data(part)
        try:
            return process_bytes(data, self.processor), hashlib.sha256(data).digest()
        except ImageError as e:
            raise bad(f"{pp}.image_url", f"'{pp}.image_url': {_named(str(e))}") from None

    def prompt(self, ids: list[int], parts: list[dict]) -> tuple[list[int], tuple[ImageInput, ...]]:
        """`ids` (one placeholder per image part, in order) with each placeholder repeated once per merged row,
        and the images over them (worker pool)."""
        done = [self.decode(p) for p in parts]
        at = [i for i, t in enumerate(ids) if t == self.image_token_id]
        if len(at) != len(done):
            raise ApiError(400, f"the rendered prompt holds {len(at)} image placeholders for {len(done)} images",
                           param="messages")
        out, images, prev = [], [], 0
        for i, (img, digest) in zip(at, done):
            out += ids[prev:i]
            images.append(ImageInput(len(out), img.pixel_values, img.grid, img.n_tokens, digest))
            out += [self.image_token_id] * img.n_tokens
            prev = i + 1
        return out + ids[prev:], tuple(images)


def _named(why: str) -> str:
    """The processor's reason, naming a decompression bomb as such."""
    return f"decompression bomb: {why}" if "decompression bomb" in why.lower() else why
