"""load: an open-loop load generator with vLLM `bench serve` result keys.

`--num-prompts N` seeded random token-id prompts of `--input-len L` tokens (drawn from the server's own token
ids, sent as ids so lengths are exact, salted with `cache_salt` so a repeated run does not hit a warm prefix
cache), each asking for `--output-len O` tokens with ignore_eos. Arrivals are Poisson at `--request-rate R`
(exponential gaps from a seeded RNG; gamma with `--burstiness`; `inf` sends all at once), with at most
`--max-concurrency C` requests in flight (later arrivals wait, and their timing starts when they are sent).

Metrics as vLLM computes them: TTFT = first chunk with a token; TPOT = (e2el - ttft) / (output tokens - 1)
for replies of 2+ tokens; ITL = gaps between token chunks; E2EL = request sent to stream end; numpy percentiles
and population std. Failed requests (HTTP errors, 429, SSE errors, timeouts) are counted in `failed`.
The run fails (exit 1) when more than `--max-failed` requests failed (default 0).
"""
from __future__ import annotations

import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .common import Context, Outcome, UsageError, fixed_token_ids, new_salt
from .report import format_table
from .stats import METRICS, metric_summary, parse_percentiles

UNBOUNDED_WORKERS = 1024    # without --max-concurrency, at most this many requests are in flight


def add_arguments(p) -> None:
    p.add_argument("--num-prompts", type=int, default=100, help="requests to send (default 100)")
    p.add_argument("--request-rate", default="inf", help="requests per second, or inf (default inf)")
    p.add_argument("--burstiness", type=float, default=1.0,
                   help="gamma shape of the arrival gaps; 1 = Poisson (default 1)")
    p.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight (default: none)")
    p.add_argument("--input-len", type=int, default=1024, help="prompt tokens per request (default 1024)")
    p.add_argument("--output-len", type=int, default=128, help="tokens generated per request (default 128)")
    p.add_argument("--seed", type=int, default=0, help="seed for prompts and arrivals (default 0)")
    p.add_argument("--percentiles", default="99", help="extra p<P> keys, e.g. 50,90,99 (99 always)")
    p.add_argument("--max-failed", type=int, default=0, help="failed requests tolerated (default 0)")
    p.add_argument("--salt", default=None, help="cache_salt for the run (default: random per run)")
    p.add_argument("--no-salt", action="store_true", help="send no cache_salt")
    p.add_argument("--save-detailed", action="store_true", help="keep per-request ITLs in the report")
    p.add_argument("--vocab-size", type=int, default=None,
                   help="vocabulary size, used only when the server has no /tokenize")


def parse_rate(text) -> float:
    s = str(text).strip().lower()
    if s in ("inf", "infinity", "+inf"):
        return math.inf
    try:
        r = float(s)
    except ValueError as e:
        raise UsageError(f"--request-rate: {text!r} is not a number or inf") from e
    if not r > 0:
        raise UsageError("--request-rate must be > 0 (or inf)")
    return r


def arrival_offsets(n: int, rate: float, seed: int, burstiness: float = 1.0) -> list[float]:
    """Send times (seconds from the start) of n requests: the first at 0, then gaps drawn from
    gamma(shape=burstiness, scale=1/(rate*burstiness)) (exponential with mean 1/rate when burstiness is 1),
    from a seeded RNG. All zeros at an infinite rate."""
    if n <= 0:
        return []
    if math.isinf(rate):
        return [0.0] * n
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n - 1)
    return [0.0] + np.cumsum(gaps).tolist()


def random_prompts(pool: list[int], n: int, length: int, seed: int) -> list[list[int]]:
    """n seeded random token-id prompts of exactly `length` tokens drawn from `pool`."""
    rng = np.random.default_rng([seed, 1])
    arr = np.asarray(sorted(set(pool)), dtype=np.int64)
    return [arr[rng.integers(0, len(arr), size=length)].tolist() for _ in range(n)]


def run(ctx: Context) -> Outcome:
    a = ctx.args
    rate = parse_rate(a.request_rate)
    if a.num_prompts < 1 or a.input_len < 1 or a.output_len < 1:
        raise UsageError("load needs --num-prompts, --input-len and --output-len >= 1")
    if a.max_concurrency is not None and a.max_concurrency < 1:
        raise UsageError("--max-concurrency must be >= 1")
    if a.burstiness <= 0:
        raise UsageError("--burstiness must be > 0")
    try:
        percentiles = parse_percentiles(a.percentiles)
    except ValueError as e:
        raise UsageError(f"--percentiles: {e}") from e
    mml = ctx.max_model_len
    if mml and a.input_len + a.output_len > mml:
        raise UsageError(f"--input-len {a.input_len} + --output-len {a.output_len} exceed the server's "
                         f"max_model_len {mml}")
    pool, source = fixed_token_ids(ctx)
    prompts = random_prompts(pool, a.num_prompts, a.input_len, a.seed)
    salt = None if a.no_salt else new_salt(a.salt)
    extra = {} if salt is None else {"cache_salt": salt}
    bodies = [ctx.completion_body(p, a.output_len, 0.0, **extra) for p in prompts]
    offsets = arrival_offsets(a.num_prompts, rate, a.seed, a.burstiness)

    results = [None] * a.num_prompts
    sent_at = [None] * a.num_prompts        # when each request arrived (was released to the pool)
    lock = threading.Lock()
    inflight = {"now": 0, "max": 0}
    workers = a.max_concurrency or min(a.num_prompts, UNBOUNDED_WORKERS)
    bar = ctx.progress(a.num_prompts, "load")

    def work(i: int) -> None:
        with lock:
            inflight["now"] += 1
            inflight["max"] = max(inflight["max"], inflight["now"])
        try:
            results[i] = ctx.send(bodies[i])
        finally:
            with lock:
                inflight["now"] -= 1
            bar.update()

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="load") as pool_ex:
        for i, off in enumerate(offsets):
            delay = start + off - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            sent_at[i] = time.perf_counter() - start
            pool_ex.submit(work, i)
    duration = time.perf_counter() - start
    bar.close()

    out = Outcome(results={})
    res = out.results
    res.update(_metrics(results, prompts, duration, percentiles))
    send_span = sent_at[-1] - sent_at[0]
    res.update({
        "num_prompts": a.num_prompts,
        "request_rate": "inf" if math.isinf(rate) else rate,
        "burstiness": a.burstiness,
        "max_concurrency": a.max_concurrency,
        "input_len": a.input_len, "output_len": a.output_len, "seed": a.seed,
        "token_source": source, "salt": salt,
        "send_duration": send_span,
        "achieved_request_rate": (a.num_prompts - 1) / send_span if send_span > 0 else None,
        "scheduled_request_rate": (a.num_prompts - 1) / offsets[-1] if offsets[-1] > 0 else None,
        "max_in_flight": inflight["max"],
        "percentiles": percentiles,
    })
    res["errors"] = _errors(results)
    res["input_lens"] = [len(p) for p in prompts]
    done = [r if r is not None and r.ok else None for r in results]
    res["output_lens"] = [r.output_tokens if r else 0 for r in done]
    res["ttfts"] = [r.ttft if r else 0.0 for r in done]
    if a.save_detailed:
        res["itls"] = [r.itls if r else [] for r in done]
    if res["failed"] > a.max_failed:
        top = ", ".join(f"{k} x{v}" for k, v in list(res["errors"].items())[:3])
        out.failures.append(f"{res['failed']} of {a.num_prompts} requests failed (--max-failed {a.max_failed})"
                            f": {top}")
    short = sum(1 for r in done if r and r.output_tokens < a.output_len)
    if short:
        out.warnings.append(f"{short} replies stopped before {a.output_len} tokens (ignore_eos not honoured?)")
    out.tables.append(_table(res, percentiles))
    return out


def _metrics(results, prompts, duration: float, percentiles) -> dict:
    ok = [(r, p) for r, p in zip(results, prompts) if r is not None and r.ok]
    total_in = sum(r.prompt_tokens if r.prompt_tokens is not None else len(p) for r, p in ok)
    total_out = sum(r.output_tokens for r, _ in ok)
    ttfts = [r.ttft for r, _ in ok if r.ttft is not None]
    tpots = [r.tpot for r, _ in ok if r.tpot is not None]
    itls = [g for r, _ in ok for g in r.itls]
    e2els = [r.e2el for r, _ in ok if r.e2el is not None]
    m = {
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "duration": duration,
        "request_throughput": len(ok) / duration,
        "output_throughput": total_out / duration,
        "total_token_throughput": (total_in + total_out) / duration,
    }
    for name, vals in zip(METRICS, (ttfts, tpots, itls, e2els)):
        m.update(metric_summary(name, vals, percentiles))
    return m


def _errors(results) -> dict:
    errs: dict[str, int] = {}
    for r in results:
        if r is None:
            errs["bench exception"] = errs.get("bench exception", 0) + 1
        elif not r.ok:
            key = f"HTTP {r.status}" if r.status and r.status != 200 else (r.error or "unknown").split(":")[0]
            errs[key] = errs.get(key, 0) + 1
    return errs


def _table(res: dict, percentiles) -> str:
    rows = [
        ["Successful requests", res["completed"]],
        ["Failed requests", res["failed"]],
        ["Benchmark duration (s)", f"{res['duration']:.2f}"],
        ["Target request rate (req/s)", res["request_rate"] if isinstance(res["request_rate"], str)
         else f"{res['request_rate']:.2f}"],
        ["Seeded schedule rate (req/s)", "-" if res["scheduled_request_rate"] is None
         else f"{res['scheduled_request_rate']:.2f}"],
        ["Achieved send rate (req/s)", "-" if res["achieved_request_rate"] is None
         else f"{res['achieved_request_rate']:.2f}"],
        ["Max in flight", res["max_in_flight"]],
        ["Total input tokens", res["total_input_tokens"]],
        ["Total generated tokens", res["total_output_tokens"]],
        ["Request throughput (req/s)", f"{res['request_throughput']:.2f}"],
        ["Output token throughput (tok/s)", f"{res['output_throughput']:.2f}"],
        ["Total token throughput (tok/s)", f"{res['total_token_throughput']:.2f}"],
    ]
    from .stats import percentile_word
    for m in METRICS:
        rows.append([f"Mean {m.upper()} (ms)", f"{res[f'mean_{m}_ms']:.2f}"])
        rows.append([f"Median {m.upper()} (ms)", f"{res[f'median_{m}_ms']:.2f}"])
        rows.append([f"Std {m.upper()} (ms)", f"{res[f'std_{m}_ms']:.2f}"])
        for p in percentiles:
            w = percentile_word(p)
            rows.append([f"P{w} {m.upper()} (ms)", f"{res[f'p{w}_{m}_ms']:.2f}"])
    return format_table(["load (vLLM bench serve keys)", "value"], rows)
