"""The server's image parts (cupyglm.server.images): the part checks and the placeholder expansion, without a
server (the real server's refusals: tests/e2e/test_server_images.py)."""
from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image

from cupyglm.server.errors import ApiError
from cupyglm.server.images import ImagePrep, count_images, image_part
from cupyglm.vision.processor import ProcessorConfig


def data_url(h: int, w: int) -> str:
    buf = io.BytesIO()
    Image.fromarray(np.full((h, w, 3), 128, np.uint8)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_part_forms_and_refusals():
    u = data_url(28, 28)
    assert image_part("p", {"type": "image_url", "image_url": {"url": u}})["url"] == u
    assert image_part("p", {"type": "image_url", "image_url": u})["param"] == "p"
    remote = image_part("p", {"type": "image_url", "image_url": {"url": "http://x/y.png"}})   # judged in the pool
    with pytest.raises(ApiError, match="remote image URLs are refused .*--vision-urls") as e:
        ImagePrep(ProcessorConfig(), image_token_id=9).decode(remote)
    assert e.value.status == 400 and e.value.param == "p.image_url"
    for url, words in (("data:text/plain;base64,AA==", "media"), ("data:image/png,raw", "base64 data"),
                       ("ftp://x", "data: URL")):
        with pytest.raises(ApiError, match=words) as e:
            image_part("p", {"type": "image_url", "image_url": {"url": url}})
        assert e.value.status == 400 and e.value.param == "p.image_url"
    msgs = [{"role": "user", "content": ["a", {"type": "image_url"}, {"type": "image_url"}]}]
    assert count_images(msgs, 2) == 2
    with pytest.raises(ApiError, match="too many images: the request holds 2, .* at most 1"):
        count_images(msgs, 1)


def test_placeholders_expand_once_per_merged_row():
    prep = ImagePrep(ProcessorConfig(), image_token_id=9)
    parts = [{"url": data_url(56, 56), "param": "a"}, {"url": data_url(56, 112), "param": "b"}]
    ids, images = prep.prompt([1, 8, 9, 7, 2, 8, 9, 7], parts)
    n = [im.n_tokens for im in images]
    assert n == [16, 18]                # the minimum budget of 16 tokens, scaled up keeping the aspect
    assert ids == [1, 8] + [9] * n[0] + [7, 2, 8] + [9] * n[1] + [7]
    assert [im.start for im in images] == [2, 2 + n[0] + 3]
    with pytest.raises(ApiError, match="2 image placeholders for 1 images"):
        prep.prompt([9, 9], parts[:1])
