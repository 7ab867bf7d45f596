"""cache: time to first token for fixed token arrays of exact lengths, cold (and optionally reused).

The arrays are the fixed text tokenized by the server (/tokenize), cycled to each length, sent as token-id
prompts to /v1/completions so lengths are exact. Every request of a run is salted: `cache_salt` is sent and the
first tokens are replaced deterministically from a run salt (per length and rep), so no earlier run, and no
other length of this run, shares a prefix with it. `--require-cold` asserts usage.prompt_tokens_details.
cached_tokens == 0 on each first request; `--require-reuse` repeats each request and asserts cached_tokens > 0
on the repeat (and that the repeat's tokens equal the first reply's).
"""
from __future__ import annotations

from .common import Context, Outcome, UsageError, compare, fixed_token_ids, new_salt, parse_list, \
    salted_tokens
from .report import format_table
from .stats import median


def add_arguments(p) -> None:
    p.add_argument("--lengths", default="2048,8192", help="prompt lengths in tokens (default 2048,8192)")
    p.add_argument("--tokens", type=int, default=64, help="tokens generated per request (default 64)")
    p.add_argument("--reps", type=int, default=1, help="cold requests per length, each uniquely salted")
    p.add_argument("--require-cold", action="store_true",
                   help="fail unless cached_tokens == 0 on the first request of each length")
    p.add_argument("--require-reuse", action="store_true",
                   help="repeat each request; fail unless the repeat reports cached_tokens > 0")
    p.add_argument("--salt", default=None, help="run salt (default: a fresh random one per run)")
    p.add_argument("--vocab-size", type=int, default=None,
                   help="vocabulary size, used only when the server has no /tokenize")


def run(ctx: Context) -> Outcome:
    a = ctx.args
    lengths = parse_list(a.lengths, int, "--lengths")
    if any(n < 1 for n in lengths) or a.tokens < 1 or a.reps < 1:
        raise UsageError("cache needs --lengths >= 1, --tokens >= 1, --reps >= 1")
    mml = ctx.max_model_len
    if mml:
        too_long = [n for n in lengths if n + a.tokens > mml]
        if too_long:
            raise UsageError(f"--lengths {','.join(map(str, too_long))} + --tokens {a.tokens} exceed the "
                             f"server's max_model_len {mml}")
    salt = new_salt(a.salt)
    base, source = fixed_token_ids(ctx)
    out = Outcome(results={"salt": salt, "token_source": source, "lengths": []})
    per = 2 if a.require_reuse else 1
    with ctx.progress(len(lengths) * a.reps * per, "cache") as bar:
        for n in lengths:
            reps = []
            for rep in range(a.reps):
                s = f"{salt}-{n}-{rep}"
                body = ctx.completion_body(salted_tokens(base, n, s), a.tokens, 0.0, cache_salt=s)
                cold = ctx.send(body)
                bar.update()
                warm = None
                if a.require_reuse:
                    warm = ctx.send(body)
                    bar.update()
                reps.append((s, cold, warm))
            out.results["lengths"].append(_length(ctx, out, n, reps))
    out.tables.append(_table(out.results["lengths"], a.require_reuse))
    return out


def _length(ctx: Context, out: Outcome, n: int, reps: list) -> dict:
    a = ctx.args
    label = f"{n} tokens"
    items = []
    for s, cold, warm in reps:
        item = {"salt": s, "cold": cold.brief(), "warm": warm.brief() if warm else None, "warm_equal": None}
        if not cold.ok:
            out.failures.append(f"{label}: cold request failed: {cold.error}")
        else:
            if cold.prompt_tokens is not None and cold.prompt_tokens != n:
                out.warnings.append(f"{label}: server counted {cold.prompt_tokens} prompt tokens")
            cached = cold.cached_tokens
            if a.require_cold and cached is None:
                out.failures.append(f"{label}: the server does not report usage.prompt_tokens_details."
                                    f"cached_tokens, so --require-cold cannot be verified")
            elif a.require_cold and cached != 0:
                out.failures.append(f"{label}: not cold: cached_tokens {cached} on the first request "
                                    f"(salt {s})")
            elif cached:
                out.warnings.append(f"{label}: first request reused {cached} cached tokens")
            if cold.sha_conflict:
                out.failures.append(f"{label}: server token_sha disagrees with its token_ids")
        if warm is not None:
            if not warm.ok:
                out.failures.append(f"{label}: repeated request failed: {warm.error}")
            else:
                if warm.cached_tokens is None:
                    out.failures.append(f"{label}: the server does not report cached_tokens, so "
                                        f"--require-reuse cannot be verified")
                elif warm.cached_tokens <= 0:
                    out.failures.append(f"{label}: no reuse: cached_tokens 0 on the repeated request")
                cmp = compare(cold, warm)
                item["warm_equal"] = cmp["status"]
                if cmp["status"] == "unequal":
                    out.failures.append(f"{label}: the repeated (cached) reply differs from the cold one at "
                                        f"token {cmp['first_diff']}")
                elif cmp["status"] == "unverified":
                    out.warnings.append(f"{label}: cold vs repeated reply unverified (no token_sha)")
        items.append(item)
    colds = [c for _, c, _ in reps if c.ok]
    warms = [w for _, _, w in reps if w is not None and w.ok]
    return {
        "length": n,
        "tokens": a.tokens,
        "reps": items,
        "median_ttft_s": median([c.ttft for c in colds]),
        "cached_tokens": [c.cached_tokens for _, c, _ in reps],
        "prompt_tokens": colds[0].prompt_tokens if colds else None,
        "token_sha": colds[0].token_sha if colds else None,
        "median_decode_tok_s": median([c.decode_tok_s for c in colds]),
        "warm_median_ttft_s": median([w.ttft for w in warms]) if warms else None,
        "warm_cached_tokens": [w.cached_tokens for _, _, w in reps if w is not None],
    }


def _table(lengths: list, reuse: bool) -> str:
    headers = ["length", "prompt tokens", "cached (cold)", "ttft s (cold)", "decode tok/s", "token_sha"]
    if reuse:
        headers += ["cached (repeat)", "ttft s (repeat)", "repeat equal"]
    rows = []
    for d in lengths:
        row = [d["length"], d["prompt_tokens"], "/".join("-" if c is None else str(c) for c in d["cached_tokens"]),
               _f(d["median_ttft_s"], 4), d["median_decode_tok_s"], d["token_sha"] or "-"]
        if reuse:
            row += ["/".join("-" if c is None else str(c) for c in d["warm_cached_tokens"]),
                    _f(d["warm_median_ttft_s"], 4),
                    "/".join(str(r["warm_equal"]) for r in d["reps"])]
        rows.append(row)
    return format_table(headers, rows, title="cache (cold time to first token)")


def _f(x, nd):
    return "-" if x is None else f"{x:.{nd}f}"
