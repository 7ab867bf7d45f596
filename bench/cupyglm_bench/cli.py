"""cupyglm-bench: benchmarks and exactness checks against any OpenAI-compatible server.

    cupyglm-bench decode     --base-url http://127.0.0.1:8000/v1 --tokens 256 --reps 3 --temperatures 0,0.7
    cupyglm-bench cache      --lengths 2048,8192 --require-cold [--require-reuse]
    cupyglm-bench concurrent --levels 1,2,4 --alone --serial [--strict]
    cupyglm-bench resume     --turns 4 [--fresh-url URL]
    cupyglm-bench load       --num-prompts 200 --request-rate 4 --max-concurrency 8 --input-len 1024 --output-len 128

Exit status: 0 all checks passed, 1 a check failed, 2 usage error or unreachable server (one line naming the URL).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from . import SUBCOMMANDS
from . import cache, concurrent, decode, load, resume
from .client import Client, ModelsError, ServerUnreachable, normalize_base_url
from .common import Context, UsageError
from .report import build_report, validate_report, write_report

MODULES = {"decode": decode, "cache": cache, "concurrent": concurrent, "resume": resume, "load": load}
PROG = "cupyglm-bench"


def _json_object(text: str) -> dict:
    try:
        v = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from e
    if not isinstance(v, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return v


def _base_url(text: str) -> str:
    try:
        return normalize_base_url(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    g = common.add_argument_group("server and output")
    g.add_argument("--base-url", type=_base_url, default="http://127.0.0.1:8000/v1",
                   help="OpenAI-compatible base URL (default http://127.0.0.1:8000/v1)")
    g.add_argument("--model", default=None, help="model id (default: the first id from GET /v1/models)")
    g.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    g.add_argument("--output", default=None, metavar="FILE.json", help="write the JSON report here")
    g.add_argument("--no-progress", action="store_true", help="no progress bar (shown only on a terminal)")
    g.add_argument("--timeout", type=float, default=600.0, help="per-request read timeout, seconds (600)")
    g.add_argument("--no-token-ids", action="store_true",
                   help="do not send return_token_ids (for servers that reject unknown fields)")
    g.add_argument("--extra-body", type=_json_object, default=None, metavar="JSON",
                   help="extra fields merged into every request body, e.g. '{\"top_k\": 1}'")
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[2:]))
    sub = p.add_subparsers(dest="subcommand", metavar="SUBCOMMAND", required=True)
    for name in SUBCOMMANDS:
        mod = MODULES[name]
        sp = sub.add_parser(name, parents=[common], help=mod.__doc__.splitlines()[0],
                            description=mod.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(sp)
    return p


def _print_outcome(subcommand: str, outcome) -> None:
    for t in outcome.tables:
        print(t)
        print()
    for w in outcome.warnings:
        print(f"warning: {w}")
    for f in outcome.failures:
        print(f"FAIL: {f}")
    print(f"{subcommand}: {'PASS' if not outcome.failures else 'FAIL'} "
          f"({len(outcome.failures)} failure(s), {len(outcome.warnings)} warning(s))", flush=True)


def _say(msg: str) -> None:
    print(f"{PROG}: {msg}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)               # exits 2 with argparse's usage message
    client = Client(args.base_url, api_key=args.api_key, timeout=args.timeout)
    try:
        try:
            models = client.models()
        except ModelsError as e:
            if not (args.model and e.status in (404, 405)):    # no /models route: --model is enough
                _say(str(e))
                return 2
            models = []
        except ServerUnreachable as e:
            _say(str(e))
            return 2
        entry = None
        if args.model:
            entry = next((m for m in models if m.get("id") == args.model), None)
            if models and entry is None:
                ids = ", ".join(str(m.get("id")) for m in models)
                _say(f"model {args.model!r} is not served at {client.base_url} (it serves: {ids})")
                return 2
            model = args.model
        elif models and models[0].get("id"):
            entry, model = models[0], str(models[0]["id"])
        else:
            _say(f"server at {client.base_url} lists no models; pass --model")
            return 2
        ctx = Context(client=client, model=model, models_entry=entry, args=args,
                      show_progress=not args.no_progress and sys.stderr.isatty())
        try:
            outcome = MODULES[args.subcommand].run(ctx)
        except UsageError as e:
            _say(f"{args.subcommand}: {e}")
            return 2
        except ServerUnreachable as e:
            _say(str(e))
            return 2
    except KeyboardInterrupt:
        _say("interrupted")
        return 130
    finally:
        client.close()

    try:
        _print_outcome(args.subcommand, outcome)
    except BrokenPipeError:                          # e.g. piped into head: the report and exit code still count
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if args.output:
        opts = {k: v for k, v in vars(args).items() if k not in ("api_key",)}
        rep = build_report(subcommand=args.subcommand, argv=[PROG, *argv], base_url=client.base_url,
                           model=model, models_entry=entry, args=opts, results=outcome.results,
                           failures=outcome.failures, warnings=outcome.warnings)
        errs = validate_report(rep)
        if errs:                                    # a bug in the bench, not in the server
            _say("report does not validate: " + "; ".join(errs))
        write_report(args.output, rep)
    return 0 if not outcome.failures else 1


if __name__ == "__main__":
    sys.exit(main())
