"""decode: single-stream decode speed on fixed prompts, and whether repeated runs give the same tokens.

Cells = prompt kind (a raw-completion code prompt via /v1/completions, a chat prompt with thinking off via
/v1/chat/completions) x temperature. Each rep streams `--tokens` tokens with ignore_eos; decode tok/s =
(completion_tokens - 1) / (time of last piece - time of first piece); medians over reps. Sampled cells are
seeded. Greedy cells whose reps differ fail the run (exit 1); sampled ones are flagged.

With KV rows in host memory (cupyglm's CUPYGLM_KV_HOST=1, read from its /metrics), `kv_host` gives the row
cache's hit rate over the timed requests and the bytes a decode token copied across the bus.

`--draft both` runs every cell with "draft": true and "draft": false on the same server (cupyglm's MTP drafts;
other servers ignore or refuse the field): the two must give the same tokens (drafted = serial, else exit 1),
and `draft_ratio` gives drafted / serial median tok/s per prompt and temperature.
"""
from __future__ import annotations

from .common import Context, Outcome, UsageError, compare, parse_list
from .prompts import chat_prompt, code_prompt
from .report import format_table
from .stats import median

KINDS = ("code", "chat")


def add_arguments(p) -> None:
    p.add_argument("--tokens", type=int, default=256, help="tokens per reply (default 256)")
    p.add_argument("--reps", type=int, default=3, help="repetitions per cell (default 3)")
    p.add_argument("--temperatures", default="0", help="comma list, e.g. 0,0.7 (default 0); > 0 is seeded")
    p.add_argument("--seed", type=int, default=0, help="seed for sampled cells (default 0)")
    p.add_argument("--prompts", default="code,chat", help="prompt kinds: code, chat (default both)")
    p.add_argument("--warmup", type=int, default=1, help="untimed requests per prompt kind first (default 1)")
    p.add_argument("--strict", action="store_true", help="a missing token_sha fails instead of 'unverified'")
    p.add_argument("--draft", default="server", choices=("server", "on", "off", "both"),
                   help='"draft" per request: server (field not sent), on, off, or both side by side')


def _request(ctx: Context, kind: str, tokens: int, temperature: float, seed: int) -> tuple[str, str, dict]:
    if kind == "code":
        name, text = code_prompt(0)
        return name, "completions", ctx.completion_body(text, tokens, temperature, seed)
    name, text = chat_prompt(0)
    return name, "chat", ctx.chat_body([{"role": "user", "content": text}], tokens, temperature, seed)


def run(ctx: Context) -> Outcome:
    a = ctx.args
    if a.tokens < 2 or a.reps < 1 or a.warmup < 0:
        raise UsageError("decode needs --tokens >= 2, --reps >= 1, --warmup >= 0")
    temps = parse_list(a.temperatures, float, "--temperatures")
    kinds = parse_list(a.prompts, str, "--prompts")
    for k in kinds:
        if k not in KINDS:
            raise UsageError(f"--prompts: unknown kind {k!r} (choose from {', '.join(KINDS)})")
    out = Outcome(results={"cells": []})
    before = None
    total = len(kinds) * (a.warmup + len(temps) * a.reps)
    with ctx.progress(total, "decode") as bar:
        for kind in kinds:
            for _ in range(a.warmup):
                ctx.send(_request(ctx, kind, min(a.tokens, 16), 0.0, a.seed)[2])
                bar.update()
            if before is None:
                before = ctx.client.metrics(KV_HOST) or {}
            for temp in temps:
                name, endpoint, body = _request(ctx, kind, a.tokens, temp, a.seed)
                pair = []
                for draft in DRAFTS[a.draft]:
                    runs = []
                    for _ in range(a.reps):
                        runs.append(ctx.send(body if draft is None else {**body, "draft": draft}))
                        bar.update()
                    cell = _cell(ctx, out, name, endpoint, temp, runs)
                    cell["draft"] = draft
                    pair.append(cell)
                    out.results["cells"].append(cell)
                if len(pair) == 2:
                    _pair(out, pair)
    out.tables.append(_table(out.results["cells"]))
    host = _kv_host(before or {}, ctx.client.metrics(KV_HOST))
    if host:
        out.results["kv_host"] = host
        head = ["row cache hits", "misses", "hit rate", "bytes / decode token (since startup)"]
        out.tables.append(format_table(head, [[host["hits"], host["misses"], host["hit_rate"],
                                               host["bytes_per_decode_token"]]], title="kv host rows"))
    return out


KV_HOST = "cupyglm:kv_host_"


def _kv_host(before: dict, after: dict | None) -> dict | None:
    """The row cache over the timed requests (the server's totals since startup, differenced), or None."""
    if not after or f"{KV_HOST}row_cache_hits" not in after:
        return None
    hits = after[f"{KV_HOST}row_cache_hits"] - before.get(f"{KV_HOST}row_cache_hits", 0.0)
    misses = after[f"{KV_HOST}row_cache_misses"] - before.get(f"{KV_HOST}row_cache_misses", 0.0)
    return {"hits": int(hits), "misses": int(misses), "hit_rate": hits / (hits + misses) if hits + misses else None,
            "bytes_per_decode_token": after.get(f"{KV_HOST}bytes_per_decode_token")}


DRAFTS = {"server": (None,), "on": (True,), "off": (False,), "both": (True, False)}


def _pair(out: Outcome, pair: list) -> None:
    on, off = pair
    label = f"{on['prompt']} t={on['temperature']:g}"
    if on["token_sha"] != off["token_sha"]:
        out.failures.append(f"{label}: drafted token_sha {on['token_sha']} differs from serial {off['token_sha']}")
    ratio = on["median_tok_s"] / off["median_tok_s"] if on["median_tok_s"] and off["median_tok_s"] else None
    out.results.setdefault("draft_ratio", []).append(
        {"prompt": on["prompt"], "temperature": on["temperature"], "drafted_tok_s": on["median_tok_s"],
         "serial_tok_s": off["median_tok_s"], "ratio": ratio, "equal": on["token_sha"] == off["token_sha"]})


def _cell(ctx, out: Outcome, name: str, endpoint: str, temp: float, runs: list) -> dict:
    label = f"{name} t={temp:g}"
    failed = [r for r in runs if not r.ok]
    for r in failed:
        out.failures.append(f"{label}: request failed: {r.error}")
    for r in runs:
        if r.sha_conflict:
            out.failures.append(f"{label}: server token_sha {r.server_token_sha} disagrees with its token_ids "
                                f"({r.computed_token_sha})")
    ok = [r for r in runs if r.ok]
    shas = [r.token_sha for r in runs]
    if failed:
        status = "failed"
    elif any(s is None for s in shas):
        status = "unverified"
    elif len(set(shas)) == 1:
        status = "equal"
    else:
        status = "unequal"
    first_diff = None
    if status == "unequal":
        odd = next(r for r in runs if r.token_sha != runs[0].token_sha)
        first_diff = compare(runs[0], odd)["first_diff"]
        msg = f"{label}: reps differ (token_sha {sorted(set(shas))}, first differing token {first_diff})"
        (out.failures if temp == 0 else out.warnings).append(msg)
    elif status == "unverified":
        msg = f"{label}: no token_sha (the server sent neither token_sha nor token_ids): unverified"
        (out.failures if ctx.args.strict else out.warnings).append(msg)
    short = [r for r in ok if r.completion_tokens is not None and r.completion_tokens < ctx.args.tokens]
    if short:
        out.warnings.append(f"{label}: {len(short)} rep(s) stopped before {ctx.args.tokens} tokens "
                            f"(ignore_eos not honoured?)")
    tok_s = [r.decode_tok_s for r in ok]
    return {
        "prompt": name, "endpoint": endpoint, "temperature": temp,
        "seed": ctx.args.seed if temp > 0 else None,
        "reps": [r.brief() for r in runs],
        "median_tok_s": median(tok_s),
        "min_tok_s": min((t for t in tok_s if t is not None), default=None),
        "max_tok_s": max((t for t in tok_s if t is not None), default=None),
        "median_ttft_s": median([r.ttft for r in ok]),
        "completion_tokens": _int(median([r.completion_tokens for r in ok])),
        "token_sha": shas[0] if status == "equal" else None,
        "token_shas": shas,
        "sha_status": status,
        "first_diff": first_diff,
    }


def _table(cells: list) -> str:
    rows = [[c["prompt"], f"{c['temperature']:g}", {None: "-", True: "on", False: "off"}[c.get("draft")],
             len(c["reps"]), c["median_tok_s"], c["min_tok_s"],
             c["max_tok_s"], c["median_ttft_s"] and c["median_ttft_s"] * 1000, c["completion_tokens"],
             c["token_sha"] or "-", c["sha_status"]] for c in cells]
    return format_table(["prompt", "temp", "draft", "reps", "tok/s (median)", "min", "max", "ttft ms", "tokens",
                         "token_sha", "reps equal"], rows, title="decode")


def _int(x):
    return int(x) if x is not None and float(x).is_integer() else x
