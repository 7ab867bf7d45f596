"""A streaming OpenAI-compatible client over httpx that timestamps every SSE chunk.

One `Client` is shared by many threads (httpx.Client is thread-safe). `Client.stream()` never raises for a
failed request: HTTP errors, SSE error events, timeouts and broken streams come back as `StreamResult(ok=False)`
so the load generator counts them. Only `Client.models()` raises `ServerUnreachable` (exit 2 in the CLI).

Token identity: `token_sha` = the first 12 hex characters of SHA-256 over the reply's token ids written as
comma-joined decimals. The server's own `token_sha` wins when present; else it is computed from the `token_ids`
the server streams back when it honours `return_token_ids`; else it is missing (None).
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

import httpx


class ServerUnreachable(Exception):
    """The server at the base URL could not be reached (or would not list its models)."""


class ModelsError(ServerUnreachable):
    """The server answered GET /models with an HTTP error (`status`)."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


def token_sha(ids) -> str:
    return hashlib.sha256(",".join(str(int(t)) for t in ids).encode()).hexdigest()[:12]


def decode_tok_s(completion_tokens, t_first, t_last):
    """(completion_tokens - 1) / (time of last piece - time of first piece); None when undefined."""
    if completion_tokens is None or t_first is None or t_last is None:
        return None
    if completion_tokens < 2 or t_last <= t_first:
        return None
    return (completion_tokens - 1) / (t_last - t_first)


def first_difference(a, b):
    """First index where two token id lists differ (the shorter length if one is a prefix); None if equal."""
    if a is None or b is None:
        return None
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def normalize_base_url(url: str) -> str:
    """Strip the trailing slash; a bare host (no path) gets /v1."""
    url = url.rstrip("/")
    parts = urlsplit(url)
    if not parts.scheme or not parts.netloc:
        raise ValueError(f"--base-url {url!r} is not an http(s) URL")
    if parts.path in ("", "/"):
        url = urlunsplit((parts.scheme, parts.netloc, "/v1", "", ""))
    return url


def root_url(base_url: str) -> str:
    """The server root: the base URL without its trailing /v1 (where vLLM and SGLang serve /tokenize)."""
    return base_url[: -len("/v1")] if base_url.endswith("/v1") else base_url


@dataclass
class StreamResult:
    ok: bool = False
    status: int | None = None
    error: str | None = None
    retry_after: str | None = None
    t_sent: float = 0.0                   # perf_counter just before the request was sent
    t_first: float | None = None          # first chunk that carried a token
    t_last: float | None = None           # last chunk that carried a token
    t_end: float | None = None            # stream finished ([DONE] or failure)
    chunk_times: list = field(default_factory=list)   # perf_counter of every chunk that carried a token
    text: str = ""
    reasoning: str = ""
    token_ids: list | None = None
    prompt_token_ids: list | None = None
    server_token_sha: str | None = None
    usage: dict | None = None
    finish_reason: str | None = None
    done: bool = False

    # ---- derived ----
    @property
    def completion_tokens(self):
        if self.usage and self.usage.get("completion_tokens") is not None:
            return int(self.usage["completion_tokens"])
        if self.token_ids is not None:
            return len(self.token_ids)
        return None

    @property
    def output_tokens(self) -> int:
        """completion_tokens, else the number of token-bearing chunks (what a load report can always count)."""
        ct = self.completion_tokens
        return ct if ct is not None else len(self.chunk_times)

    @property
    def prompt_tokens(self):
        if self.usage and self.usage.get("prompt_tokens") is not None:
            return int(self.usage["prompt_tokens"])
        return len(self.prompt_token_ids) if self.prompt_token_ids is not None else None

    @property
    def cached_tokens(self):
        details = (self.usage or {}).get("prompt_tokens_details") or {}
        v = details.get("cached_tokens")
        return int(v) if v is not None else None

    @property
    def computed_token_sha(self):
        return token_sha(self.token_ids) if self.token_ids is not None else None

    @property
    def token_sha(self):
        return self.server_token_sha or self.computed_token_sha

    @property
    def token_sha_source(self):
        if self.server_token_sha:
            return "server"
        return "token_ids" if self.token_ids is not None else None

    @property
    def sha_conflict(self) -> bool:
        """The server's token_sha disagrees with the token ids it streamed."""
        c = self.computed_token_sha
        return bool(self.server_token_sha and c and self.server_token_sha != c)

    @property
    def ttft(self):
        return None if self.t_first is None else self.t_first - self.t_sent

    @property
    def e2el(self):
        return None if self.t_end is None else self.t_end - self.t_sent

    @property
    def itls(self) -> list:
        ts = self.chunk_times
        return [b - a for a, b in zip(ts, ts[1:])]

    @property
    def tpot(self):
        n = self.output_tokens
        if not self.ok or n < 2 or self.ttft is None or self.e2el is None:
            return None
        return (self.e2el - self.ttft) / (n - 1)

    @property
    def decode_tok_s(self):
        return decode_tok_s(self.completion_tokens, self.t_first, self.t_last)

    def brief(self) -> dict:
        """The JSON-friendly summary of one request kept in reports."""
        return {
            "ok": self.ok, "status": self.status, "error": self.error,
            "ttft_s": _r(self.ttft), "e2el_s": _r(self.e2el), "decode_tok_s": _r(self.decode_tok_s, 3),
            "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens, "token_sha": self.token_sha,
            "token_sha_source": self.token_sha_source, "finish_reason": self.finish_reason,
        }


def _r(x, nd=6):
    return None if x is None else round(x, nd)


def _error_message(resp: httpx.Response) -> str:
    try:
        body = resp.json()
        err = body.get("error", body) if isinstance(body, dict) else body
        msg = err.get("message") if isinstance(err, dict) else err
        return f"HTTP {resp.status_code}: {msg}"
    except Exception:  # noqa: BLE001 - not JSON
        return f"HTTP {resp.status_code}: {resp.text[:200]}"


class Client:
    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 600.0,
                 connect_timeout: float = 10.0):
        self.base_url = normalize_base_url(base_url)
        self.root_url = root_url(self.base_url)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
            trust_env=False,
        )

    def close(self) -> None:
        self.http.close()

    # ---- plain endpoints ----
    def models(self) -> list[dict]:
        url = f"{self.base_url}/models"
        try:
            r = self.http.get(url, timeout=30.0)
        except httpx.TransportError as e:
            raise ServerUnreachable(f"cannot reach server at {self.base_url} ({type(e).__name__}: {e})") from e
        if r.status_code != 200:
            raise ModelsError(f"server at {self.base_url} answered GET /models with {_error_message(r)}",
                              r.status_code)
        try:
            data = r.json().get("data") or []
        except (ValueError, AttributeError) as e:
            raise ServerUnreachable(f"server at {self.base_url} sent a non-JSON /models reply") from e
        return [m for m in data if isinstance(m, dict)]

    def tokenize(self, text: str, model: str | None) -> list[int] | None:
        """Token ids of `text` from the server's /tokenize (vLLM and SGLang shape); None if it has none."""
        body = {"prompt": text, "add_special_tokens": False}
        if model:
            body["model"] = model
        for url in (f"{self.root_url}/tokenize", f"{self.base_url}/tokenize"):
            try:
                r = self.http.post(url, json=body, timeout=60.0)
            except httpx.HTTPError:
                continue
            if r.status_code != 200:
                continue
            try:
                toks = r.json().get("tokens")
            except (ValueError, AttributeError):
                continue
            if isinstance(toks, list) and toks and all(isinstance(t, int) for t in toks):
                return toks
        return None

    def metrics(self, prefix: str) -> dict[str, float] | None:
        """Unlabelled samples of the server's Prometheus /metrics whose names start with `prefix`; None if it has
        no /metrics or none of them."""
        try:
            r = self.http.get(f"{self.root_url}/metrics", timeout=30.0)
        except httpx.HTTPError:
            return None
        if r.status_code != 200:
            return None
        out = {}
        for line in r.text.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0].startswith(prefix):
                try:
                    out[parts[0]] = float(parts[1])
                except ValueError:
                    continue
        return out or None

    # ---- streaming ----
    def completion(self, body: dict) -> StreamResult:
        return self.stream("/completions", body)

    def chat(self, body: dict) -> StreamResult:
        return self.stream("/chat/completions", body)

    def stream(self, path: str, body: dict) -> StreamResult:
        res = StreamResult()
        res.t_sent = time.perf_counter()
        try:
            with self.http.stream("POST", self.base_url + path, json=body) as resp:
                res.status = resp.status_code
                if resp.status_code != 200:
                    resp.read()
                    res.error = _error_message(resp)
                    res.retry_after = resp.headers.get("retry-after")
                    return res
                self._consume(resp, res)
        except httpx.TimeoutException as e:
            res.error = f"timeout: {type(e).__name__}"
        except httpx.HTTPError as e:
            res.error = f"{type(e).__name__}: {e}"
        except Exception as e:  # noqa: BLE001 - a broken reply must be counted, not crash the run
            res.error = f"{type(e).__name__}: {e}"
        finally:
            res.t_end = time.perf_counter()
            if res.error is None and not res.done:
                res.error = "stream ended without data: [DONE]"
            res.ok = res.error is None
        return res

    @staticmethod
    def _consume(resp: httpx.Response, res: StreamResult) -> None:
        event = None
        for line in resp.iter_lines():
            if not line:
                event = None
                continue
            if line.startswith("event:"):
                event = line[6:].strip()
                continue
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                res.done = True
                break
            now = time.perf_counter()
            try:
                obj = json.loads(payload)
            except ValueError:
                res.error = res.error or f"bad SSE data: {payload[:120]}"
                continue
            if not isinstance(obj, dict):
                continue
            if "error" in obj or event == "error":
                err = obj.get("error", obj)
                msg = err.get("message") if isinstance(err, dict) else err
                res.error = res.error or f"stream error: {msg}"
                continue
            _take_chunk(obj, now, res)


def _take_chunk(obj: dict, now: float, res: StreamResult) -> None:
    if obj.get("usage"):
        res.usage = obj["usage"]
    sha = obj.get("token_sha") or (obj.get("usage") or {}).get("token_sha")
    if obj.get("prompt_token_ids") is not None:
        res.prompt_token_ids = list(obj["prompt_token_ids"])
    choices = obj.get("choices") or []
    has_token = False
    for ch in choices:
        if not isinstance(ch, dict) or ch.get("index", 0) != 0:
            continue
        delta = ch.get("delta") if isinstance(ch.get("delta"), dict) else {}
        text = ch.get("text")
        if text is None:
            text = delta.get("content")
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        tids = ch.get("token_ids")
        if tids is None:
            tids = delta.get("token_ids")
        if ch.get("prompt_token_ids") is not None:
            res.prompt_token_ids = list(ch["prompt_token_ids"])
        sha = sha or ch.get("token_sha")
        if text:
            res.text += text
            has_token = True
        if reasoning:
            res.reasoning += reasoning
            has_token = True
        if tids:
            res.token_ids = (res.token_ids or []) + [int(t) for t in tids]
            has_token = True
        elif tids is not None and res.token_ids is None:
            res.token_ids = []                 # the server honours return_token_ids
        if ch.get("finish_reason"):
            res.finish_reason = ch["finish_reason"]
    if sha:
        res.server_token_sha = str(sha)
    if has_token:
        if res.t_first is None:
            res.t_first = now
        res.t_last = now
        res.chunk_times.append(now)
