"""JSON reports (schema_version 1), their validator, and plain-text tables.

A report:
    schema_version 1, command (argv list), subcommand, created (ISO-8601 UTC),
    server {base_url, model, models_entry (the server's /v1/models entry or null)},
    bench_version (cupyglm's package version, "unknown" if not installed), git_sha (of the bench's own
    repository, or null), args (the parsed options), passed, exit_code, failures [str], warnings [str],
    results {...} (per subcommand; the keys checked by `validate_report` are in RESULT_KEYS).
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import subprocess
from importlib import metadata
from pathlib import Path

from . import SCHEMA_VERSION, SUBCOMMANDS

LOAD_SCALAR_KEYS = ("completed", "failed", "total_input_tokens", "total_output_tokens", "duration",
                    "request_throughput", "output_throughput", "total_token_throughput")
LOAD_METRICS = ("ttft", "tpot", "itl", "e2el")

RESULT_KEYS = {
    "decode": {"cells": list},
    "cache": {"lengths": list, "salt": (str, type(None))},
    "concurrent": {"cells": list, "summary": dict},
    "resume": {"turns": list, "summary": dict},
    "load": {k: (int, float) for k in LOAD_SCALAR_KEYS},
}
CELL_KEYS = {
    "decode": ("prompt", "endpoint", "temperature", "reps", "median_tok_s", "token_sha", "sha_status"),
    "cache": ("length", "reps", "median_ttft_s", "cached_tokens"),
    "concurrent": ("prompt_kind", "temperature", "level", "reps", "aggregate_tok_s"),
    "resume": ("turn", "cached_tokens", "ttft_s", "equal"),
}
ITEM_LIST = {"decode": "cells", "cache": "lengths", "concurrent": "cells", "resume": "turns"}


def bench_version() -> str:
    try:
        return metadata.version("cupyglm")
    except metadata.PackageNotFoundError:
        return "unknown"


def git_sha() -> str | None:
    """`git rev-parse HEAD` of the repository this bench package lives in; None when it is not in one."""
    here = Path(__file__).resolve().parent
    try:
        r = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True,
                           timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    sha = r.stdout.strip()
    return sha if r.returncode == 0 and len(sha) == 40 else None


def build_report(*, subcommand: str, argv: list[str], base_url: str, model: str, models_entry: dict | None,
                 args: dict, results: dict, failures: list[str], warnings: list[str]) -> dict:
    return {
        "schema_version": SCHEMA_VERSION,
        "command": list(argv),
        "subcommand": subcommand,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "server": {"base_url": base_url, "model": model, "models_entry": models_entry},
        "bench_version": bench_version(),
        "git_sha": git_sha(),
        "args": args,
        "passed": not failures,
        "exit_code": 0 if not failures else 1,
        "failures": list(failures),
        "warnings": list(warnings),
        "results": results,
    }


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def validate_report(rep) -> list[str]:
    """Every way `rep` departs from schema 1, as messages; [] means valid."""
    errs: list[str] = []
    if not isinstance(rep, dict):
        return ["report is not an object"]

    def need(key, types, where=rep, prefix=""):
        if key not in where:
            errs.append(f"missing {prefix}{key}")
            return None
        if not isinstance(where[key], types) or (types is int and isinstance(where[key], bool)):
            errs.append(f"{prefix}{key} has type {type(where[key]).__name__}")
            return None
        return where[key]

    if need("schema_version", int) not in (None, SCHEMA_VERSION):
        errs.append(f"schema_version is {rep['schema_version']}, expected {SCHEMA_VERSION}")
    cmd = need("command", list)
    if cmd is not None and not all(isinstance(c, str) for c in cmd):
        errs.append("command must be a list of strings")
    sub = need("subcommand", str)
    if sub is not None and sub not in SUBCOMMANDS:
        errs.append(f"subcommand {sub!r} is not one of {', '.join(SUBCOMMANDS)}")
    need("created", str)
    server = need("server", dict)
    if server is not None:
        need("base_url", str, server, "server.")
        need("model", str, server, "server.")
        if "models_entry" not in server:
            errs.append("missing server.models_entry")
        elif server["models_entry"] is not None and not isinstance(server["models_entry"], dict):
            errs.append("server.models_entry must be an object or null")
    need("bench_version", str)
    if "git_sha" not in rep:
        errs.append("missing git_sha")
    elif rep["git_sha"] is not None and not isinstance(rep["git_sha"], str):
        errs.append("git_sha must be a string or null")
    need("args", dict)
    passed = need("passed", bool)
    code = need("exit_code", int)
    fails = need("failures", list)
    need("warnings", list)
    if passed is not None and fails is not None and passed != (not fails):
        errs.append("passed disagrees with failures")
    if code is not None and passed is not None and (code == 0) != passed:
        errs.append("exit_code disagrees with passed")
    results = need("results", dict)
    if results is None or sub not in RESULT_KEYS:
        return errs
    for key, types in RESULT_KEYS[sub].items():
        need(key, types, results, "results.")
    if sub == "load":
        for k in LOAD_SCALAR_KEYS:
            if k in results and not _finite(results[k]):
                errs.append(f"results.{k} is not a finite number")
        for m in LOAD_METRICS:
            for stat in ("mean", "median", "std", "p99"):
                k = f"{stat}_{m}_ms"
                if k not in results:
                    errs.append(f"missing results.{k}")
                elif not _finite(results[k]):
                    errs.append(f"results.{k} is not a finite number")
    else:
        items = results.get(ITEM_LIST[sub])
        if isinstance(items, list):
            if not items:
                errs.append(f"results.{ITEM_LIST[sub]} is empty")
            for i, item in enumerate(items):
                if not isinstance(item, dict):
                    errs.append(f"results.{ITEM_LIST[sub]}[{i}] is not an object")
                    continue
                for k in CELL_KEYS[sub]:
                    if k not in item:
                        errs.append(f"missing results.{ITEM_LIST[sub]}[{i}].{k}")
    return errs


def write_report(path: str, rep: dict) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(rep, f, indent=2, allow_nan=False)
        f.write("\n")
    os.replace(tmp, path)


# ---- tables ----
def fmt(x, nd=2) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def format_table(headers: list[str], rows: list[list], title: str | None = None) -> str:
    cells = [[str(h) for h in headers]] + [[c if isinstance(c, str) else fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [all(_looks_numeric(r[i]) for r in cells[1:]) and len(cells) > 1 for i in range(len(headers))]

    def line(r):
        return "  ".join(c.rjust(w) if numeric[i] else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))

    out = [title] if title else []
    out.append(line(cells[0]))
    out.append("  ".join("-" * w for w in widths))
    out.extend(line(r) for r in cells[1:])
    return "\n".join(s.rstrip() for s in out)


def _looks_numeric(s: str) -> bool:
    if s == "-":
        return True
    try:
        float(s.replace(",", ""))
        return True
    except ValueError:
        return False
