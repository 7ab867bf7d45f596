"""Remote image URLs (--vision-urls): an `http(s)://` image fetched in the worker pool, never from this host's or
its network's addresses.

The host is resolved once and every address it resolves to is checked (`check_address`: only global unicast
addresses; loopback, link-local, private, shared, multicast, reserved and unspecified ones refused, an IPv4-mapped
IPv6 address judged by its IPv4 one); the connection goes to the checked address (so a second lookup cannot swap
it), with the URL's host for TLS. A redirect is followed only to a URL that passes the same checks, at most
MAX_REDIRECTS. The body is bounded by `max_bytes` (the announced length and the bytes read) and the whole fetch by
`timeout_s`. Every refusal is a `FetchError` naming the problem; the caller turns it into a 400 naming the part.
"""
from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
import time
import urllib.parse

MAX_BYTES = 20 * 2**20
TIMEOUT_S = 10.0
MAX_REDIRECTS = 3
_CHUNK = 1 << 16


class FetchError(ValueError):
    """A remote image that was refused or could not be fetched."""


def address_problem(ip: str) -> str | None:
    """Why a remote image may not come from `ip` (None: a global unicast address it may come from)."""
    a = ipaddress.ip_address(ip.split("%", 1)[0])
    if isinstance(a, ipaddress.IPv6Address) and a.ipv4_mapped is not None:
        a = a.ipv4_mapped
    for kind, bad in (("loopback", a.is_loopback), ("link-local", a.is_link_local), ("multicast", a.is_multicast),
                      ("unspecified", a.is_unspecified), ("private", a.is_private), ("reserved", a.is_reserved)):
        if bad:
            return f"a {kind} address ({a})"
    return None if a.is_global else f"a non-public address ({a})"


def check_address(ip: str) -> None:
    why = address_problem(ip)
    if why is not None:
        raise FetchError(f"the image URL's host resolves to {why}; remote images come only from public addresses")


def resolve(host: str, port: int) -> list[str]:
    """Every address `host` resolves to (a FetchError when it does not)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise FetchError(f"the image URL's host {host!r} does not resolve ({e})") from None
    return list(dict.fromkeys(info[4][0] for info in infos))


class Fetcher:
    """Fetches one image URL's bytes within the limits; `check` and `resolve` are the address rules."""

    def __init__(self, max_bytes: int = MAX_BYTES, timeout_s: float = TIMEOUT_S, check=check_address,
                 resolve=resolve):
        self.max_bytes, self.timeout_s = max_bytes, timeout_s
        self.check, self.resolve = check, resolve

    def fetch(self, url: str) -> bytes:
        deadline = time.monotonic() + self.timeout_s
        for _ in range(MAX_REDIRECTS + 1):
            status, location, body = self._get(url, deadline)
            if location is None:
                if status != 200:
                    raise FetchError(f"the image URL answered HTTP {status}")
                return body
            url = urllib.parse.urljoin(url, location)
        raise FetchError(f"the image URL redirected more than {MAX_REDIRECTS} times")

    def _target(self, url: str) -> tuple[urllib.parse.SplitResult, str, int]:
        """(the parsed URL, the checked address to connect to, its port)."""
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise FetchError(f"a redirect led to {url[:80]!r}, not an http(s) URL")
        try:
            port = u.port or (443 if u.scheme == "https" else 80)
        except ValueError:
            raise FetchError("the image URL's port is not a number in 0..65535") from None
        addrs = self.resolve(u.hostname, port)
        for a in addrs:                      # every address: the resolver's order may differ next time
            self.check(a)
        return u, addrs[0], port

    def _get(self, url: str, deadline: float) -> tuple[int, str | None, bytes]:
        """(status, redirect location or None, body) of one GET."""
        u, addr, port = self._target(url)
        left = deadline - time.monotonic()
        if left <= 0:
            raise FetchError(f"the image URL took longer than {self.timeout_s:g} s")
        conn = _Pinned(u.hostname, port, addr, left, u.scheme == "https")
        try:
            path = (u.path or "/") + (f"?{u.query}" if u.query else "")
            conn.request("GET", path, headers={"Accept": "image/*", "User-Agent": "cupyglm"})
            resp = conn.getresponse()
            if resp.status in (301, 302, 303, 307, 308):
                return resp.status, resp.getheader("Location") or "", b""
            return resp.status, None, self._body(resp, deadline)
        except socket.timeout:
            raise FetchError(f"the image URL took longer than {self.timeout_s:g} s") from None
        except (OSError, http.client.HTTPException) as e:
            raise FetchError(f"the image URL could not be fetched ({type(e).__name__}: {e})") from None
        finally:
            conn.close()

    def _body(self, resp, deadline: float) -> bytes:
        length = resp.getheader("Content-Length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            raise FetchError(f"the image at the URL is {int(length)} bytes, over the limit of {self.max_bytes}")
        out = bytearray()
        while True:
            if time.monotonic() > deadline:
                raise FetchError(f"the image URL took longer than {self.timeout_s:g} s")
            chunk = resp.read(_CHUNK)
            if not chunk:
                return bytes(out)
            out += chunk
            if len(out) > self.max_bytes:
                raise FetchError(f"the image at the URL is over the limit of {self.max_bytes} bytes")


class _Pinned(http.client.HTTPSConnection):
    """A connection to an already checked address, named by the URL's host (Host header, TLS server name)."""

    def __init__(self, host: str, port: int, addr: str, timeout: float, tls: bool):
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self.addr, self.tls = addr, tls

    def connect(self) -> None:
        sock = socket.create_connection((self.addr, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host) if self.tls else sock
