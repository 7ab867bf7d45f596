"""Is the server's event loop ever blocked by another request's preparation? Measured side by side.

    python bench/event_loop_probe.py --url http://127.0.0.1:8000 [--prompt-mb 10] [--tokenize-mb 16]

Runs one stream (ignore_eos) and polls /health every 20 ms, first alone (baseline), then while a completion with
a `--prompt-mb` MB prompt and a `--tokenize-mb` MB /tokenize are sent (the server refuses both as too long, or
413 past --max-body-bytes). Prints one SUMMARY line: /health latency (median, max) and the stream's inter-token
gaps (median, max), baseline and under load, and what the two big requests answered and how long they took.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time

import httpx


def _stream_gaps(url: str, max_tokens: int, out: dict) -> None:
    gaps, last = [], None
    with httpx.Client(timeout=120) as c:
        with c.stream("POST", url + "/v1/completions", json={
                "prompt": "Once", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    now = time.monotonic()
                    if last is not None:
                        gaps.append(now - last)
                    last = now
    out["gaps"] = gaps


def _poll_health(url: str, stop: threading.Event, out: list) -> None:
    with httpx.Client(timeout=60) as c:
        while not stop.is_set():
            t0 = time.monotonic()
            c.get(url + "/health")
            out.append(time.monotonic() - t0)
            time.sleep(0.02)


def _big(url: str, path: str, body: bytes, out: dict, key: str) -> None:
    t0 = time.monotonic()
    with httpx.Client(timeout=300) as c:
        r = c.post(url + path, content=body, headers={"Content-Type": "application/json"})
    out[key] = (r.status_code, round(time.monotonic() - t0, 3))


def phase(url: str, max_tokens: int, load: list[tuple[str, bytes]]) -> dict:
    """One stream and the /health poller, with the `load` requests sent once the stream is running."""
    stop = threading.Event()
    health: list[float] = []
    res: dict = {}
    s = threading.Thread(target=_stream_gaps, args=(url, max_tokens, res))
    h = threading.Thread(target=_poll_health, args=(url, stop, health))
    s.start()
    h.start()
    time.sleep(0.5)
    big = [threading.Thread(target=_big, args=(url, path, body, res, path)) for path, body in load]
    for t in big:
        t.start()
    for t in big:
        t.join()
    s.join()
    stop.set()
    h.join()
    gaps = res.pop("gaps")
    health.sort()
    p95 = health[int(0.95 * (len(health) - 1))]
    return {"health_ms": (round(1e3 * statistics.median(health), 1), round(1e3 * p95, 1), round(1e3 * max(health), 1)),
            "gap_ms": (round(1e3 * statistics.median(gaps), 1), round(1e3 * max(gaps), 1)),
            "big": res}


def run(url: str, prompt_mb: float, tokenize_mb: float, max_tokens: int = 120) -> dict:
    # one word without spaces: the slowest text for a BPE tokenizer
    prompt = json.dumps({"prompt": "abcdefghij" * int(prompt_mb * 1e5), "max_tokens": 4}).encode()
    tok = json.dumps({"prompt": "abcdefghij" * int(tokenize_mb * 1e5)}).encode()
    base = phase(url, max_tokens, [])
    loaded = phase(url, max_tokens, [("/v1/completions", prompt), ("/tokenize", tok)])
    return {"baseline": base, "loaded": loaded, "prompt_bytes": len(prompt), "tokenize_bytes": len(tok)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True, help="server base URL (no /v1)")
    p.add_argument("--prompt-mb", type=float, default=10.0)
    p.add_argument("--tokenize-mb", type=float, default=16.0)
    p.add_argument("--max-tokens", type=int, default=120)
    a = p.parse_args(argv)
    r = run(a.url.rstrip("/"), a.prompt_mb, a.tokenize_mb, a.max_tokens)
    b, lo = r["baseline"], r["loaded"]
    print(f"SUMMARY event_loop: /health ms median/p95/max baseline {b['health_ms']} loaded {lo['health_ms']}; "
          f"inter-token gap ms median/max baseline {b['gap_ms']} loaded {lo['gap_ms']}; "
          f"big requests (status, s): {lo['big']} ({r['prompt_bytes']} and {r['tokenize_bytes']} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
