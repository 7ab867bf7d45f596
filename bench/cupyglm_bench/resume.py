"""resume: a fixed multi-turn conversation; every resumed turn must equal the same turn computed fresh.

The resumed request may restore the conversation's kept prompt state; the fresh one must not.

Thinking off, temperature 0, a fixed max_tokens. The conversation is salted with one run salt (so a previous run
does not warm it); the fresh twin of each turn is the same request with a unique `cache_salt` (or, with
`--fresh-url`, sent to a second server). Per turn: cached_tokens, TTFT of both, and whether the replies are the
same (token_sha and text). Exit 1 on any mismatch or failed request.
"""
from __future__ import annotations

from .client import Client
from .common import Context, Outcome, UsageError, compare, new_salt
from .prompts import RESUME_SYSTEM, RESUME_SYSTEM_SHORT, RESUME_TURNS
from .report import format_table


def add_arguments(p) -> None:
    p.add_argument("--turns", type=int, default=4, help=f"turns, 1..{len(RESUME_TURNS)} (default 4)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per reply (default 64)")
    p.add_argument("--system", choices=("long", "short", "none"), default="long",
                   help="system prompt: long (instructions + a fixed document, ~1k tokens), short, none")
    p.add_argument("--fresh-url", default=None, help="compute the fresh twin on this second server instead")
    p.add_argument("--fresh-model", default=None, help="model on --fresh-url (default: its first model)")
    p.add_argument("--salt", default=None, help="run salt (default: a fresh random one per run)")
    p.add_argument("--require-reuse", action="store_true",
                   help="fail unless turns 2.. report cached_tokens > 0 on the resumed request")
    p.add_argument("--strict", action="store_true", help="a missing token_sha fails even if texts are equal")


def run(ctx: Context) -> Outcome:
    a = ctx.args
    if not 1 <= a.turns <= len(RESUME_TURNS) or a.max_tokens < 1:
        raise UsageError(f"resume needs 1 <= --turns <= {len(RESUME_TURNS)} and --max-tokens >= 1")
    salt = new_salt(a.salt)
    fresh_client, fresh_model = ctx.client, ctx.model
    if a.fresh_url:
        fresh_client = Client(a.fresh_url, api_key=a.api_key, timeout=a.timeout)
        models = fresh_client.models()                 # ServerUnreachable -> exit 2 in the CLI
        fresh_model = a.fresh_model or (models[0]["id"] if models else ctx.model)
    out = Outcome(results={"turns": [], "summary": {}})
    system = {"long": RESUME_SYSTEM, "short": RESUME_SYSTEM_SHORT, "none": None}[a.system]
    messages = [{"role": "system", "content": system}] if system else []
    try:
        with ctx.progress(2 * a.turns, "resume") as bar:
            for t in range(a.turns):
                messages.append({"role": "user", "content": RESUME_TURNS[t]})
                body = ctx.chat_body(list(messages), a.max_tokens, 0.0, ignore_eos=False, cache_salt=salt)
                resumed = ctx.send(body)
                bar.update()
                fbody = dict(body, cache_salt=f"{salt}-fresh-{t}", model=fresh_model)
                fresh = ctx.send(fbody, client=fresh_client)
                bar.update()
                out.results["turns"].append(_turn(ctx, out, t + 1, resumed, fresh))
                messages.append({"role": "assistant", "content": resumed.text})
    finally:
        if fresh_client is not ctx.client:
            fresh_client.close()
    turns = out.results["turns"]
    out.results["summary"] = {
        "salt": salt, "system": a.system, "fresh": "url" if a.fresh_url else "cache_salt", "fresh_url": a.fresh_url,
        "turns": len(turns), **{s: sum(x["status"] == s for x in turns)
                                for s in ("equal", "text-equal", "unequal", "failed")},
    }
    out.tables.append(_table(turns))
    return out


def _turn(ctx: Context, out: Outcome, t: int, resumed, fresh) -> dict:
    label = f"turn {t}"
    cmp = compare(resumed, fresh)
    text_equal = (resumed.text, resumed.reasoning) == (fresh.text, fresh.reasoning)
    status, first_diff = cmp["status"], cmp["first_diff"]
    if status == "failed":
        for name, r in (("resumed", resumed), ("fresh", fresh)):
            if not r.ok:
                out.failures.append(f"{label}: {name} request failed: {r.error}")
    elif status == "unequal" or not text_equal:
        status = "unequal"
        where = f"at token {first_diff}" if first_diff is not None else "(text differs)"
        out.failures.append(f"{label}: resumed reply differs from fresh {where}")
    elif status == "unverified":
        status = "text-equal"
        msg = f"{label}: replies' texts are equal but no token_sha to compare"
        (out.failures if ctx.args.strict else out.warnings).append(msg)
    for name, r in (("resumed", resumed), ("fresh", fresh)):
        if r.ok and r.sha_conflict:
            out.failures.append(f"{label}: {name}: server token_sha disagrees with its token_ids")
    if fresh.ok and fresh.cached_tokens:
        out.warnings.append(f"{label}: the fresh request reused {fresh.cached_tokens} cached tokens "
                            f"(cache_salt ignored?)")
    if ctx.args.require_reuse and t > 1 and resumed.ok and not resumed.cached_tokens:
        out.failures.append(f"{label}: no reuse: resumed request reports cached_tokens "
                            f"{resumed.cached_tokens}")
    return {
        "turn": t,
        "prompt_tokens": resumed.prompt_tokens,
        "cached_tokens": resumed.cached_tokens,
        "ttft_s": resumed.ttft,
        "completion_tokens": resumed.completion_tokens,
        "token_sha": resumed.token_sha,
        "fresh_cached_tokens": fresh.cached_tokens,
        "fresh_ttft_s": fresh.ttft,
        "fresh_token_sha": fresh.token_sha,
        "equal": {"equal": True, "text-equal": True, "unequal": False}.get(status),
        "status": status,
        "first_diff": first_diff,
        "resumed": resumed.brief(),
        "fresh": fresh.brief(),
    }


def _table(turns) -> str:
    rows = [[x["turn"], x["prompt_tokens"], x["cached_tokens"], _ms(x["ttft_s"]), x["fresh_cached_tokens"],
             _ms(x["fresh_ttft_s"]), x["completion_tokens"], x["token_sha"] or "-", x["status"]] for x in turns]
    return format_table(["turn", "prompt tokens", "cached", "ttft ms", "fresh cached", "fresh ttft ms",
                         "tokens", "token_sha", "resumed = fresh"], rows, title="resume")


def _ms(x):
    return None if x is None else x * 1000.0
