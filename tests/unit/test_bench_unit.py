"""cupyglm-bench pure helpers: token_sha, decode tok/s, stats as vLLM computes them, arrivals, token arrays,
the report schema validator, tables."""
from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pytest

from cupyglm_bench import report, stats
from cupyglm_bench.client import StreamResult, decode_tok_s, first_difference, normalize_base_url, \
    root_url, token_sha
from cupyglm_bench.common import exact_tokens, salted_tokens
from cupyglm_bench.load import arrival_offsets, parse_rate, random_prompts
from cupyglm_bench.common import UsageError


# ---- token_sha and per-request derived numbers -------------------------------------------------------------------

def test_token_sha_is_sha256_of_comma_joined_decimals_first_12_hex():
    assert token_sha([1, 22, 333]) == hashlib.sha256(b"1,22,333").hexdigest()[:12]
    assert token_sha([]) == hashlib.sha256(b"").hexdigest()[:12]
    assert len(token_sha(range(100))) == 12
    assert token_sha([1, 2]) != token_sha([12])


def test_token_sha_matches_the_servers():
    from cupyglm.server.responses import token_sha as server_token_sha

    ids = [5, 0, 4095, 17]
    assert token_sha(ids) == server_token_sha(ids)


def test_decode_tok_s_formula():
    # 101 tokens, first piece at t=1.0, last at t=3.0 -> 100 gaps over 2 s
    assert decode_tok_s(101, 1.0, 3.0) == pytest.approx(50.0)
    assert decode_tok_s(1, 1.0, 3.0) is None           # one token: no decode interval
    assert decode_tok_s(10, 2.0, 2.0) is None          # everything in one chunk
    assert decode_tok_s(None, 1.0, 2.0) is None
    assert decode_tok_s(10, None, 2.0) is None


def test_stream_result_derived_metrics():
    r = StreamResult(ok=True, done=True, t_sent=10.0, t_first=10.5, t_last=11.5, t_end=11.6,
                     chunk_times=[10.5, 10.75, 11.0, 11.5], token_ids=[1, 2, 3, 4, 5],
                     usage={"prompt_tokens": 7, "completion_tokens": 5,
                            "prompt_tokens_details": {"cached_tokens": 0}})
    assert r.ttft == pytest.approx(0.5)
    assert r.e2el == pytest.approx(1.6)
    assert r.itls == pytest.approx([0.25, 0.25, 0.5])
    assert r.tpot == pytest.approx((1.6 - 0.5) / 4)
    assert r.decode_tok_s == pytest.approx(4 / 1.0)
    assert (r.prompt_tokens, r.completion_tokens, r.cached_tokens) == (7, 5, 0)
    assert r.token_sha == token_sha([1, 2, 3, 4, 5]) and r.token_sha_source == "token_ids"
    r.server_token_sha = "abcdefabcdef"
    assert r.token_sha == "abcdefabcdef" and r.token_sha_source == "server" and r.sha_conflict
    bare = StreamResult(ok=True, chunk_times=[1.0, 2.0])
    assert bare.token_sha is None and bare.completion_tokens is None and bare.output_tokens == 2
    assert bare.cached_tokens is None


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 9, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2
    assert first_difference(None, [1]) is None


# ---- stats: numpy percentiles (linear), population std, vLLM key names ------------------------------------------

def test_percentiles_and_median_interpolate_linearly():
    vals = [1.0, 2.0, 3.0, 4.0]
    assert stats.percentile(vals, 50) == pytest.approx(2.5)
    assert stats.percentile(vals, 99) == pytest.approx(3.97)
    assert stats.percentile(vals, 100) == pytest.approx(4.0)
    assert stats.median([3.0, None, 1.0, 2.0]) == pytest.approx(2.0)
    assert stats.median([None]) is None


def test_std_is_population_like_vllm():
    vals = [1.0, 2.0, 3.0, 4.0]
    assert stats.std(vals) == pytest.approx(math.sqrt(1.25))          # ddof=0
    assert stats.std(vals) != pytest.approx(float(np.std(vals, ddof=1)))
    assert stats.std([]) == 0.0 and stats.mean([]) == 0.0 and stats.percentile([], 99) == 0.0


def test_metric_summary_keys_in_ms():
    s = stats.metric_summary("ttft", [0.1, 0.2, 0.3], [50.0, 99.0, 99.9])
    assert set(s) == {"mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p50_ttft_ms", "p99_ttft_ms",
                      "p99.9_ttft_ms"}
    assert s["mean_ttft_ms"] == pytest.approx(200.0)
    assert s["median_ttft_ms"] == pytest.approx(200.0)
    assert s["p50_ttft_ms"] == pytest.approx(200.0)
    assert s["std_ttft_ms"] == pytest.approx(float(np.std([100.0, 200.0, 300.0])))


def test_parse_percentiles_always_has_99():
    assert stats.parse_percentiles("50,90") == [50.0, 90.0, 99.0]
    assert stats.parse_percentiles(None) == [99.0]
    with pytest.raises(ValueError):
        stats.parse_percentiles("0")


# ---- arrivals and prompts ------------------------------------------------------------------------------------------

def test_poisson_schedule_is_seeded_with_mean_gap_one_over_rate():
    a = arrival_offsets(4000, 20.0, seed=7)
    assert a == arrival_offsets(4000, 20.0, seed=7)
    assert a != arrival_offsets(4000, 20.0, seed=8)
    assert a[0] == 0.0 and all(y >= x for x, y in zip(a, a[1:]))
    gaps = np.diff(a)
    assert gaps.mean() == pytest.approx(1 / 20.0, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.1)          # exponential: CV 1
    bursty = np.diff(arrival_offsets(4000, 20.0, seed=7, burstiness=4.0))
    assert bursty.mean() == pytest.approx(1 / 20.0, rel=0.05)
    assert bursty.std() / bursty.mean() == pytest.approx(0.5, rel=0.1)      # gamma k=4: CV 1/2
    assert arrival_offsets(5, math.inf, 0) == [0.0] * 5
    assert arrival_offsets(0, 1.0, 0) == []


def test_parse_rate():
    assert parse_rate("inf") == math.inf and parse_rate("2.5") == 2.5
    for bad in ("0", "-1", "fast"):
        with pytest.raises(UsageError):
            parse_rate(bad)


def test_random_prompts_are_exact_seeded_and_from_the_pool():
    pool = [5, 9, 11, 400]
    p = random_prompts(pool, 6, 33, seed=3)
    assert len(p) == 6 and all(len(x) == 33 for x in p)
    assert p == random_prompts(pool, 6, 33, seed=3) and p != random_prompts(pool, 6, 33, seed=4)
    assert {t for x in p for t in x} <= set(pool)


def test_salted_token_arrays_have_exact_lengths_and_no_shared_prefix():
    base = list(range(100, 160))
    assert exact_tokens(base, 130) == (base * 3)[:130]
    a = salted_tokens(base, 128, "run1-128-0")
    b = salted_tokens(base, 64, "run1-64-0")
    assert len(a) == 128 and len(b) == 64
    assert a == salted_tokens(base, 128, "run1-128-0")
    assert a[:4] != b[:4] and a[:4] != salted_tokens(base, 128, "run2-128-0")[:4]
    assert a[4:] == exact_tokens(base, 128)[4:]
    assert set(a) <= set(base)


# ---- URLs ----------------------------------------------------------------------------------------------------------

def test_base_url_normalization():
    assert normalize_base_url("http://h:1") == "http://h:1/v1"
    assert normalize_base_url("http://h:1/v1/") == "http://h:1/v1"
    assert root_url("http://h:1/v1") == "http://h:1"
    with pytest.raises(ValueError):
        normalize_base_url("localhost:8000")


# ---- the report schema --------------------------------------------------------------------------------------------

def _load_results():
    r = {k: 1 for k in report.LOAD_SCALAR_KEYS}
    for m in report.LOAD_METRICS:
        for s in ("mean", "median", "std", "p99"):
            r[f"{s}_{m}_ms"] = 1.5
    return r


def _report(sub="load", results=None, failures=()):
    return report.build_report(subcommand=sub, argv=["cupyglm-bench", sub], base_url="http://h:1/v1",
                               model="m", models_entry={"id": "m", "max_model_len": 10}, args={"x": 1},
                               results=results if results is not None else _load_results(),
                               failures=list(failures), warnings=[])


def test_a_built_report_validates_and_round_trips(tmp_path):
    rep = _report()
    assert report.validate_report(rep) == []
    assert rep["schema_version"] == 1 and rep["passed"] and rep["exit_code"] == 0
    assert isinstance(rep["bench_version"], str)
    assert rep["git_sha"] is None or len(rep["git_sha"]) == 40
    path = tmp_path / "r.json"
    report.write_report(str(path), rep)
    assert report.validate_report(json.loads(path.read_text())) == []
    failed = _report(failures=["x"])
    assert report.validate_report(failed) == [] and failed["exit_code"] == 1


@pytest.mark.parametrize("mutate, needle", [
    (lambda r: r.pop("schema_version"), "missing schema_version"),
    (lambda r: r.update(schema_version=2), "schema_version is 2"),
    (lambda r: r.update(subcommand="nope"), "subcommand 'nope'"),
    (lambda r: r.update(command="cupyglm-bench load"), "command has type str"),
    (lambda r: r["server"].pop("models_entry"), "missing server.models_entry"),
    (lambda r: r.update(git_sha=5), "git_sha must be"),
    (lambda r: r.update(passed=False), "passed disagrees"),
    (lambda r: r["results"].pop("p99_tpot_ms"), "missing results.p99_tpot_ms"),
    (lambda r: r["results"].update(duration=float("nan")), "results.duration is not a finite number"),
    (lambda r: r["results"].update(completed="8"), "results.completed has type str"),
])
def test_the_validator_names_what_is_wrong(mutate, needle):
    rep = _report()
    mutate(rep)
    errs = report.validate_report(rep)
    assert any(needle in e for e in errs), errs


def test_the_validator_checks_per_subcommand_items():
    rep = _report("decode", results={"cells": [{"prompt": "p"}]})
    errs = report.validate_report(rep)
    assert "missing results.cells[0].median_tok_s" in errs
    assert report.validate_report(_report("cache", results={"lengths": [], "salt": "s"})) == \
        ["results.lengths is empty"]
    assert report.validate_report("x") == ["report is not an object"]


def test_write_report_refuses_nan(tmp_path):
    with pytest.raises(ValueError):
        report.write_report(str(tmp_path / "x.json"), {"a": float("nan")})


def test_format_table_aligns_columns():
    t = report.format_table(["name", "tok/s"], [["a", 1.5], ["longer", None]], title="T")
    lines = t.splitlines()
    assert lines[0] == "T" and lines[1].startswith("name")
    assert lines[3].endswith("1.50") and lines[4].endswith("-")
    assert len({len(x) for x in lines[1:4]}) == 1


# ---- decode's kv host rows (the server's /metrics) -----------------------------------------------------------------

def test_decode_reads_the_kv_host_row_cache_from_metrics():
    import httpx

    from cupyglm_bench.client import Client
    from cupyglm_bench.decode import KV_HOST, _kv_host

    text = ("# HELP cupyglm:kv_host_row_cache_hits x\n# TYPE cupyglm:kv_host_row_cache_hits gauge\n"
            "cupyglm:kv_host_row_cache_hits 30.0\ncupyglm:kv_host_row_cache_misses 90.0\n"
            "cupyglm:kv_host_bytes_per_decode_token 12220.5\ncupyglm:requests_total{x=\"1\"} 3.0\n")
    c = Client("http://server:1/v1")
    c.http = httpx.Client(transport=httpx.MockTransport(
        lambda req: httpx.Response(200, text=text) if req.url.path == "/metrics" else httpx.Response(404)))
    got = c.metrics(KV_HOST)
    assert got == {"cupyglm:kv_host_row_cache_hits": 30.0, "cupyglm:kv_host_row_cache_misses": 90.0,
                   "cupyglm:kv_host_bytes_per_decode_token": 12220.5}
    host = _kv_host({"cupyglm:kv_host_row_cache_hits": 10.0, "cupyglm:kv_host_row_cache_misses": 10.0}, got)
    assert host == {"hits": 20, "misses": 80, "hit_rate": 0.2, "bytes_per_decode_token": 12220.5}
    assert _kv_host({}, None) is None and _kv_host({}, {"cupyglm:other": 1.0}) is None
    c.http = httpx.Client(transport=httpx.MockTransport(lambda req: httpx.Response(404)))
    assert c.metrics(KV_HOST) is None
