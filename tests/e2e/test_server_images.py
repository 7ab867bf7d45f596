"""Image parts through the real server (`mpirun -n 2`, TP=2, numpy) with the real openai client: PNG, JPEG and WebP
data URLs; an image request's tokens equal alone and beside other requests, and run after run, and with the tower's
weights in host memory (CUPYGLM_VISION_HOST=1, its plan line naming the staging slots); each refusal a 400
naming the part and the problem (bad base64, corrupt image, unsupported format, decompression bomb, too many
images, remote URL), the server serving on after them."""
from __future__ import annotations

import base64
import concurrent.futures
import io
import struct
import zlib

import numpy as np
import openai
import pytest
from PIL import Image

from cupyglm.config import preset

pytestmark = pytest.mark.mpi


def encoded(h: int, w: int, seed: int, fmt: str) -> bytes:
    yy, xx = np.mgrid[0:h, 0:w]
    rgb = np.stack([(xx * 255 // w + seed * 40) % 256, yy * 255 // h, (xx + yy + seed * 17) % 256], -1)
    buf = io.BytesIO()
    Image.fromarray(rgb.astype(np.uint8)).save(buf, fmt)
    return buf.getvalue()


def url(data: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64,{base64.b64encode(data).decode()}"


def bomb() -> bytes:
    """A PNG whose header claims 20000 x 20000 pixels (past Pillow's limit), with one tiny row of data."""
    png = bytearray(encoded(2, 2, 0, "PNG"))
    ihdr = bytearray(png[16:29])
    ihdr[0:8] = struct.pack(">II", 20000, 20000)
    png[16:29] = ihdr
    png[29:33] = struct.pack(">I", zlib.crc32(b"IHDR" + bytes(ihdr)))
    return bytes(png)


def messages(*urls: str, text: str = "What is in the picture?") -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return [{"role": "user", "content": [{"type": "text", "text": "Look: "}, *parts, {"type": "text", "text": text}]}]


def ask(client, msgs, seed=None, temperature=0.0):
    r = client.chat.completions.create(
        model=client.models.list().data[0].id, messages=msgs, max_tokens=8, temperature=temperature, seed=seed,
        extra_body={"return_token_ids": True, "ignore_eos": True, "chat_template_kwargs": {"enable_thinking": False}})
    d = r.model_dump(exclude_unset=True)
    return d["choices"][0]["token_ids"], d["usage"], d["choices"][0]["prompt_token_ids"]


IMAGES = [url(encoded(112, 150, 1, "PNG")), url(encoded(90, 60, 2, "JPEG"), "image/jpeg"),
          url(encoded(64, 200, 3, "WEBP"), "image/webp")]


def test_image_request_alone_equals_batched(client):
    reqs = [(messages(IMAGES[0]), None, 0.0), (messages(IMAGES[1], IMAGES[2]), 5, 0.9),
            (messages(IMAGES[2], text="Describe it."), 7, 1.0), ([{"role": "user", "content": "Hi there"}], 3, 0.8)]
    alone = [ask(client, m, s, t) for m, s, t in reqs]
    toks, usage, prompt = alone[0]
    assert len(toks) == 8 and usage["prompt_tokens_details"]["cached_tokens"] == 0
    assert prompt.count(preset("tiny").vision.image_token_id) == 24 and usage["prompt_tokens"] == len(prompt)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        batched = list(pool.map(lambda r: ask(client, *r), reqs * 2))
    assert [b[0] for b in batched] == [a[0] for a in alone] * 2
    assert ask(client, messages(IMAGES[0]))[0] == toks


@pytest.mark.parametrize("name,msgs,param,words", [
    ("bad base64", messages("data:image/png;base64,@@@"), "messages[0].content[1].image_url", "base64"),
    ("corrupt", messages(url(b"\x89PNG\r\n\x1a\n" + b"\0" * 64)), "messages[0].content[1].image_url", "corrupt"),
    ("unsupported format", messages(url(encoded(8, 8, 0, "GIF"), "image/gif")), "messages[0].content[1].image_url",
     "unsupported image format 'GIF'"),
    ("decompression bomb", messages(url(bomb())), "messages[0].content[1].image_url", "decompression bomb"),
    ("too many images", messages(*[IMAGES[0]] * 5), "messages", "too many images"),
    ("remote url", messages("https://example.com/cat.png"), "messages[0].content[1].image_url",
     "remote image URLs are refused"),
    ("not a data url", messages("file:///etc/passwd"), "messages[0].content[1].image_url", "data: URL"),
])
def test_refusals_are_400_naming_the_problem(client, name, msgs, param, words):
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, msgs)
    err = e.value.body
    assert e.value.status_code == 400 and err["param"] == param and words in err["message"], (name, err)
    assert len(ask(client, [{"role": "user", "content": "still serving?"}])[0]) == 8


def test_vision_host_gives_the_same_tokens(client, start_server, server_args):
    host = start_server(server_args, env={"CUPYGLM_VISION_HOST": "1"})
    try:
        assert "vision staging" in host.output and "in host memory" in host.output
        reqs = [(messages(IMAGES[0]), None, 0.0), (messages(IMAGES[1], IMAGES[2]), 5, 0.9)]
        with openai.OpenAI(base_url=host.url, api_key="unused", max_retries=0, timeout=60) as staged:
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                batched = list(pool.map(lambda r: ask(staged, *r)[0], reqs))
            assert [ask(staged, *r)[0] for r in reqs] == [ask(client, *r)[0] for r in reqs] == batched
    finally:
        host.kill()
