"""Remote image URLs (--vision-urls) without a network: the address rule (loopback, link-local, private, multicast
and the rest refused, IPv4-mapped IPv6 judged by its IPv4 address), a fetcher against a local HTTP server (its
loopback address allowed by the test's own rule only) bounded by size and time and refusing a redirect to a private
address, the real rule refusing that server, refusals as 400s naming the part; --vision-image-tokens resizes."""
from __future__ import annotations

import http.server
import io
import threading
import time

import numpy as np
import pytest
from PIL import Image

from cupyglm.server.errors import ApiError
from cupyglm.server.image_fetch import FetchError, Fetcher, address_problem, check_address
from cupyglm.server.images import ImagePrep
from cupyglm.settings import Settings, SettingsError
from cupyglm.vision.processor import ImageError, ProcessorConfig, process_bytes


def png(h, w, seed):
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


@pytest.mark.parametrize("ip,kind", [
    ("127.0.0.1", "loopback"), ("127.9.9.9", "loopback"), ("::1", "loopback"), ("::ffff:127.0.0.1", "loopback"),
    ("169.254.169.254", "link-local"), ("fe80::1", "link-local"), ("10.1.2.3", "private"),
    ("172.16.0.1", "private"), ("192.168.0.1", "private"), ("fd00::1", "private"), ("224.0.0.1", "multicast"),
    ("ff02::1", "multicast"), ("0.0.0.0", "unspecified"), ("100.64.0.1", "non-public"),
    ("8.8.8.8", None), ("2606:4700:4700::1111", None), ("::ffff:8.8.8.8", None)])
def test_address_rule(ip, kind):
    why = address_problem(ip)
    assert (why is None) if kind is None else (kind in why)


class _Handler(http.server.BaseHTTPRequestHandler):
    hits = 0

    def do_GET(self):
        type(self).hits += 1
        if self.path == "/slow":
            time.sleep(1.5)
        if self.path.startswith("/to/"):
            self.send_response(302)
            self.send_header("Location", "http://" + self.path[4:])
            self.end_headers()
            return
        body = png(20, 30, 1)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def local():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    _Handler.hits = 0
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def only_local(ip):
    """The test's rule: this host's loopback server allowed, everything else as the real rule says."""
    if ip != "127.0.0.1":
        check_address(ip)


def test_the_real_rule_never_reaches_loopback(local):
    with pytest.raises(FetchError, match="loopback"):
        Fetcher().fetch(local + "/img.png")
    with pytest.raises(FetchError, match="loopback"):
        Fetcher().fetch(local.replace("127.0.0.1", "localhost") + "/img.png")
    assert _Handler.hits == 0


def test_fetch_within_limits(local):
    assert Fetcher(check=only_local).fetch(local + "/img.png") == png(20, 30, 1)
    with pytest.raises(FetchError, match="over the limit of 100"):
        Fetcher(max_bytes=100, check=only_local).fetch(local + "/img.png")
    with pytest.raises(FetchError, match="longer than 0.5 s"):
        Fetcher(timeout_s=0.5, check=only_local).fetch(local + "/slow")


def test_redirects_are_checked_like_the_url(local):
    with pytest.raises(FetchError, match=r"private address \(10.0.0.5\)"):
        Fetcher(check=only_local).fetch(local + "/to/10.0.0.5/x.png")
    with pytest.raises(FetchError, match="link-local"):
        Fetcher(check=only_local).fetch(local + "/to/169.254.169.254/latest")
    with pytest.raises(FetchError, match="redirected more than 3"):
        Fetcher(check=only_local).fetch(local + "/to/" + local[7:] + "/to/" + local[7:] + "/to/" + local[7:]
                                        + "/to/" + local[7:] + "/img.png")


def test_remote_parts_refused_as_400_naming_the_part(tiny_dir, local):
    proc = ProcessorConfig.from_dir(tiny_dir)
    part = {"type": "image_url", "url": local + "/img.png", "param": "messages[0].content[1]"}
    with pytest.raises(ApiError, match="--vision-urls") as e:
        ImagePrep(proc, 7).decode(part)
    assert e.value.status == 400 and e.value.param == "messages[0].content[1].image_url"
    with pytest.raises(ApiError, match="loopback") as e:
        ImagePrep(proc, 7, Fetcher()).decode(part)
    img, _ = ImagePrep(proc, 7, Fetcher(check=only_local)).decode(part)
    assert img.n_tokens == process_bytes(png(20, 30, 1), proc).n_tokens


def test_vision_image_tokens_resizes(tiny_dir):
    proc, data = ProcessorConfig.from_dir(tiny_dir), png(224, 336, 3)
    full = process_bytes(data, proc).n_tokens
    capped = process_bytes(data, proc.capped(full // 3))
    assert full > full // 3 >= capped.n_tokens > 0 and capped.grid != process_bytes(data, proc).grid
    assert proc.capped(0) == proc and proc.capped(full * 100) == proc
    with pytest.raises(ImageError, match="--vision-image-tokens 1 is below"):
        proc.capped(1)
    s = Settings.from_argv(["--vision-image-tokens", "20", "--vision-urls"])
    assert s.vision_image_tokens == 20 and s.vision_urls
    assert Settings.from_argv([]).vision_image_tokens == 0 and not Settings.from_argv([]).vision_urls
    with pytest.raises(SettingsError, match="--vision-image-tokens"):
        Settings.from_argv(["--vision-image-tokens", "-1"])
