"""concurrent: streams released together at each level; aggregate and per-stream decode tok/s; exactness.

At level k, k streams (distinct fixed prompts of one kind) wait on one threading.Event and start at once.
`--alone`: each concurrent reply must equal the same request run alone. `--serial`: each must equal the same
request with "draft": false (and so must the alone reply). A missing hash is "unverified", never equal;
`--strict` fails on it. On a mismatch the first differing token position is reported (return_token_ids).
Exit 1 on any mismatch or failed request.
"""
from __future__ import annotations

from .common import Context, Outcome, UsageError, compare, parse_list, run_parallel
from .prompts import chat_prompt, code_prompt
from .report import format_table
from .stats import median

KINDS = ("code", "chat")
STATUSES = ("equal", "unequal", "unverified", "failed")


def add_arguments(p) -> None:
    p.add_argument("--levels", default="1,2,4", help="concurrency levels (default 1,2,4)")
    p.add_argument("--tokens", type=int, default=128, help="tokens per reply (default 128)")
    p.add_argument("--reps", type=int, default=1, help="repetitions per level (default 1)")
    p.add_argument("--temperatures", default="0", help="comma list (default 0); > 0 is seeded")
    p.add_argument("--seed", type=int, default=0, help="seed for sampled cells (default 0)")
    p.add_argument("--prompts", default="code,chat", help="prompt kinds: code, chat (default both)")
    p.add_argument("--alone", action="store_true", help="each concurrent reply must equal its solo run")
    p.add_argument("--serial", action="store_true", help='each reply must equal the same request with '
                                                          '"draft": false')
    p.add_argument("--strict", action="store_true", help="a missing token_sha fails instead of 'unverified'")


def _body(ctx: Context, kind: str, j: int, temp: float) -> tuple[str, dict]:
    a = ctx.args
    if kind == "code":
        name, text = code_prompt(j)
        return name, ctx.completion_body(text, a.tokens, temp, a.seed)
    name, text = chat_prompt(j)
    return name, ctx.chat_body([{"role": "user", "content": text}], a.tokens, temp, a.seed)


class _Tally:
    def __init__(self):
        self.counts = {k: {s: 0 for s in STATUSES} for k in ("alone", "serial", "alone_vs_serial")}

    def add(self, kind: str, status: str) -> None:
        self.counts[kind][status] += 1

    def summary(self) -> dict:
        return {k: dict(v, total=sum(v.values())) for k, v in self.counts.items()}


def run(ctx: Context) -> Outcome:
    a = ctx.args
    levels = parse_list(a.levels, int, "--levels")
    temps = parse_list(a.temperatures, float, "--temperatures")
    kinds = parse_list(a.prompts, str, "--prompts")
    if any(n < 1 for n in levels) or a.tokens < 2 or a.reps < 1:
        raise UsageError("concurrent needs --levels >= 1, --tokens >= 2, --reps >= 1")
    for k in kinds:
        if k not in KINDS:
            raise UsageError(f"--prompts: unknown kind {k!r} (choose from {', '.join(KINDS)})")
    maxl = max(levels)
    tally = _Tally()
    out = Outcome(results={"cells": [], "summary": {}})
    nref = maxl * (int(a.alone) + int(a.serial))
    total = len(kinds) * len(temps) * (nref + a.reps * len(levels))
    with ctx.progress(total, "concurrent") as bar:
        for kind in kinds:
            for temp in temps:
                reqs = [_body(ctx, kind, j, temp) for j in range(maxl)]
                alone, serial = {}, {}
                for j, (name, body) in enumerate(reqs):
                    if a.alone:
                        alone[j] = ctx.send(body)
                        bar.update()
                    if a.serial:
                        serial[j] = ctx.send(dict(body, draft=False))
                        bar.update()
                    _check_refs(ctx, out, tally, f"{name} t={temp:g}", alone.get(j), serial.get(j))
                for level in levels:
                    reps = []
                    for _ in range(a.reps):
                        res = run_parallel([lambda b=reqs[j][1]: ctx.send(b) for j in range(level)])
                        bar.update()
                        reps.append(_rep(ctx, out, tally, kind, temp, level, reqs, res, alone, serial))
                    out.results["cells"].append(_cell(kind, temp, level, reps))
    out.results["summary"] = tally.summary()
    out.tables.append(_table(out.results["cells"], a))
    out.tables.append(_summary_line(out.results["summary"], a))
    return out


REFS = {"alone": "the same request run alone", "serial": 'the same request with "draft": false',
        "alone_vs_serial": 'the same request with "draft": false'}


def _judge(ctx, out: Outcome, tally: _Tally, what: str, label: str, cmp: dict) -> None:
    tally.add(what, cmp["status"])
    if cmp["status"] == "unequal":
        out.failures.append(f"{label}: differs from {REFS[what]} at token {cmp['first_diff']}")
    elif cmp["status"] == "unverified":
        msg = f"{label}: unverified against {REFS[what]} (no token_sha and no token_ids)"
        (out.failures if ctx.args.strict else out.warnings).append(msg)


def _check_refs(ctx, out, tally, label, alone, serial) -> None:
    for what, r in (("alone", alone), ('"draft": false', serial)):
        if r is not None and not r.ok:
            out.failures.append(f"{label}: {what} request failed: {r.error}")
        if r is not None and r.sha_conflict:
            out.failures.append(f"{label}: server token_sha disagrees with its token_ids ({what})")
    if alone is not None and serial is not None:
        _judge(ctx, out, tally, "alone_vs_serial", f"{label} (alone reply)", compare(alone, serial))


def _rep(ctx, out, tally, kind, temp, level, reqs, res, alone, serial) -> dict:
    streams = []
    for j, r in enumerate(res):
        name = reqs[j][0]
        label = f"{name} t={temp:g} level {level} stream {j}"
        s = {"index": j, "prompt": name, **r.brief()}
        if not r.ok:
            out.failures.append(f"{label}: request failed: {r.error}")
        if r.sha_conflict:
            out.failures.append(f"{label}: server token_sha disagrees with its token_ids")
        if j in alone:
            cmp = compare(r, alone[j])
            s["alone"], s["alone_first_diff"] = cmp["status"], cmp["first_diff"]
            _judge(ctx, out, tally, "alone", label, cmp)
        if j in serial:
            cmp = compare(r, serial[j])
            s["serial"], s["serial_first_diff"] = cmp["status"], cmp["first_diff"]
            _judge(ctx, out, tally, "serial", label, cmp)
        streams.append(s)
    ok = [r for r in res if r.ok]
    rates = [r.decode_tok_s for r in ok if r.decode_tok_s is not None]
    wall = None
    if ok:
        span = max(r.t_end for r in ok) - min(r.t_sent for r in ok)
        wall = sum(r.output_tokens for r in ok) / span if span > 0 else None
    return {
        "streams": streams,
        "aggregate_tok_s": sum(rates) if rates else None,
        "per_stream_tok_s": median(rates),
        "wall_tok_s": wall,
        "start_skew_ms": (max(r.t_sent for r in res) - min(r.t_sent for r in res)) * 1000.0,
    }


def _cell(kind, temp, level, reps) -> dict:
    return {
        "prompt_kind": kind, "temperature": temp, "level": level, "reps": reps,
        "aggregate_tok_s": median([r["aggregate_tok_s"] for r in reps]),
        "per_stream_tok_s": median([r["per_stream_tok_s"] for r in reps]),
        "wall_tok_s": median([r["wall_tok_s"] for r in reps]),
        "start_skew_ms": max(r["start_skew_ms"] for r in reps),
    }


def _eq(cell, key) -> str:
    vals = [s.get(key) for r in cell["reps"] for s in r["streams"] if s.get(key) is not None]
    return f"{sum(v == 'equal' for v in vals)}/{len(vals)}" if vals else "-"


def _table(cells, a) -> str:
    headers = ["prompts", "temp", "level", "aggregate tok/s", "per-stream tok/s", "wall tok/s", "start skew ms"]
    if a.alone:
        headers.append("alone equal")
    if a.serial:
        headers.append("serial equal")
    rows = []
    for c in cells:
        row = [c["prompt_kind"], f"{c['temperature']:g}", c["level"], c["aggregate_tok_s"], c["per_stream_tok_s"],
               c["wall_tok_s"], c["start_skew_ms"]]
        if a.alone:
            row.append(_eq(c, "alone"))
        if a.serial:
            row.append(_eq(c, "serial"))
        rows.append(row)
    return format_table(headers, rows, title="concurrent (aggregate = sum of per-stream decode tok/s)")


def _summary_line(s, a) -> str:
    parts = []
    for k, flag in (("alone", a.alone), ("serial", a.serial), ("alone_vs_serial", a.alone and a.serial)):
        if flag:
            d = s[k]
            parts.append(f"{k.replace('_', ' ')} {d['equal']}/{d['total']} equal")
    bad = {st: sum(s[k][st] for k in s) for st in ("unequal", "unverified", "failed")}
    return ("; ".join(parts) + "; " if parts else "") + \
        f"{bad['unequal']} unequal, {bad['unverified']} unverified, {bad['failed']} failed"
