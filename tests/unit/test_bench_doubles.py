"""cupyglm-bench against test doubles (a small OpenAI-compatible server in a thread, cupyglm_bench.doubles):
deterministic -> every subcommand passes with a valid report; deliberately non-deterministic, cache-reporting,
failing and hash-less doubles -> the checks fail (exit 1) or count what they should."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
from cupyglm_bench.cli import main
from cupyglm_bench.doubles import DoubleConfig, FakeServer
from cupyglm_bench.load import arrival_offsets
from cupyglm_bench.report import validate_report

SMALL = {
    "decode": ["--tokens", "12", "--reps", "2", "--temperatures", "0,0.7", "--warmup", "1"],
    "cache": ["--lengths", "64,128", "--tokens", "8", "--require-cold", "--require-reuse"],
    "concurrent": ["--levels", "1,2,4", "--tokens", "10", "--alone", "--serial"],
    "resume": ["--turns", "4", "--max-tokens", "12"],
    "load": ["--num-prompts", "12", "--request-rate", "inf", "--input-len", "40", "--output-len", "6",
             "--percentiles", "50,90"],
}


def bench(srv: FakeServer, sub: str, *args: str, out: Path | None = None) -> tuple[int, dict | None]:
    argv = [sub, "--base-url", srv.base_url, "--no-progress", *args]
    if out is not None:
        argv += ["--output", str(out)]
    rc = main(argv)
    rep = json.loads(out.read_text()) if out is not None and out.exists() else None
    return rc, rep


@pytest.fixture(scope="module")
def good():
    with FakeServer(DoubleConfig()) as s:
        yield s


@pytest.fixture
def server_with():
    started = []

    def make(**kw) -> FakeServer:
        s = FakeServer(DoubleConfig(**kw)).start()
        started.append(s)
        return s

    yield make
    for s in started:
        s.stop()


# ---- (c) a deterministic double: everything passes and the reports validate -------------------------------------

@pytest.mark.parametrize("sub", list(SMALL))
def test_every_subcommand_passes_on_a_deterministic_double(good, sub, tmp_path, capsys):
    rc, rep = bench(good, sub, *SMALL[sub], out=tmp_path / f"{sub}.json")
    printed = capsys.readouterr().out
    assert rc == 0, printed
    assert f"{sub}: PASS" in printed
    assert validate_report(rep) == []
    assert rep["subcommand"] == sub and rep["passed"] and rep["failures"] == []
    assert rep["server"]["models_entry"]["id"] == "fake-glm"
    assert rep["command"][:2] == ["cupyglm-bench", sub]
    assert "api_key" not in rep["args"]


def test_decode_report_cells(good, tmp_path, capsys):
    rc, rep = bench(good, "decode", *SMALL["decode"], out=tmp_path / "d.json")
    assert rc == 0
    cells = rep["results"]["cells"]
    assert [(c["prompt"], c["endpoint"], c["temperature"]) for c in cells] == [
        ("fibonacci-raw", "completions", 0.0), ("fibonacci-raw", "completions", 0.7),
        ("gpu-chat-no-think", "chat", 0.0), ("gpu-chat-no-think", "chat", 0.7)]
    for c in cells:
        assert c["sha_status"] == "equal" and len(c["token_sha"]) == 12
        assert c["completion_tokens"] == 12 and c["median_tok_s"] > 0
        assert all(r["token_sha_source"] == "server" for r in c["reps"])
    assert "tok/s (median)" in capsys.readouterr().out


def test_requests_carry_the_conventions(server_with, capsys):
    s = server_with()
    assert bench(s, "decode", "--tokens", "4", "--reps", "1", "--temperatures", "0,0.7", "--warmup", "0")[0] == 0
    assert bench(s, "concurrent", "--levels", "1", "--tokens", "4", "--prompts", "code", "--serial")[0] == 0
    assert bench(s, "cache", "--lengths", "32", "--tokens", "4", "--salt", "S1")[0] == 0
    bodies = s.bodies
    for b in bodies:
        assert b["stream"] is True and b["stream_options"] == {"include_usage": True}
        assert b["return_token_ids"] is True and b["model"] == "fake-glm"
    gen = [b for b in bodies if b.get("ignore_eos")]
    chat = [b for b in gen if "messages" in b]
    assert chat and all(b["chat_template_kwargs"] == {"enable_thinking": False} for b in chat)
    assert {b.get("seed") for b in gen if b["temperature"] > 0} == {0}
    assert all("seed" not in b for b in gen if b["temperature"] == 0)
    assert any(b.get("draft") is False for b in bodies)
    cache = [b for b in bodies if b.get("cache_salt", "").startswith("S1")]
    assert len(cache) == 1 and isinstance(cache[0]["prompt"], list) and len(cache[0]["prompt"]) == 32


# ---- (a) a non-deterministic double: concurrent --alone reports unequal at the first differing token -------------

def test_concurrent_alone_reports_unequal_with_first_difference(server_with, tmp_path, capsys):
    s = server_with(deterministic=False, diverge_at=3)
    rc, rep = bench(s, "concurrent", "--levels", "1,2", "--tokens", "8", "--alone", "--prompts", "code",
                    out=tmp_path / "c.json")
    printed = capsys.readouterr().out
    assert rc == 1
    assert validate_report(rep) == [] and not rep["passed"]
    streams = [st for c in rep["results"]["cells"] for r in c["reps"] for st in r["streams"]]
    assert len(streams) == 3
    assert all(st["alone"] == "unequal" and st["alone_first_diff"] == 3 for st in streams)
    assert rep["results"]["summary"]["alone"]["unequal"] == 3
    assert "differs from the same request run alone at token 3" in printed
    assert "0/1" in printed and "0/2" in printed


def test_concurrent_serial_catches_a_draft_difference(server_with, capsys):
    s = server_with(draft_differs=True)
    rc, _ = bench(s, "concurrent", "--levels", "2", "--tokens", "6", "--alone", "--serial", "--prompts", "chat")
    out = capsys.readouterr().out
    assert rc == 1
    assert 'differs from the same request with "draft": false at token 0' in out
    assert "alone 2/2 equal" in out


def test_decode_greedy_reps_must_match_but_sampled_ones_are_only_flagged(server_with, tmp_path, capsys):
    s = server_with(deterministic=False, diverge_at=2)
    rc, rep = bench(s, "decode", "--tokens", "6", "--reps", "2", "--temperatures", "0.7", "--warmup", "0",
                    "--prompts", "code", out=tmp_path / "d.json")
    assert rc == 0 and rep["results"]["cells"][0]["sha_status"] == "unequal"
    assert rep["results"]["cells"][0]["first_diff"] == 2
    assert any("reps differ" in w for w in rep["warnings"])
    rc, rep = bench(s, "decode", "--tokens", "6", "--reps", "2", "--temperatures", "0", "--warmup", "0",
                    "--prompts", "code", out=tmp_path / "d0.json")
    assert rc == 1 and any("reps differ" in f for f in rep["failures"])


def test_resume_mismatch_fails(server_with, tmp_path, capsys):
    s = server_with(deterministic=False, diverge_at=1)
    rc, rep = bench(s, "resume", "--turns", "2", "--max-tokens", "4", out=tmp_path / "r.json")
    assert rc == 1
    assert [t["status"] for t in rep["results"]["turns"]] == ["unequal", "unequal"]
    assert rep["results"]["turns"][0]["first_diff"] == 1


def test_resume_against_a_second_server(good, server_with, tmp_path, capsys):
    other = server_with()
    rc, rep = bench(good, "resume", "--turns", "2", "--max-tokens", "4", "--fresh-url", other.base_url,
                    "--system", "short", out=tmp_path / "r.json")
    assert rc == 0 and rep["results"]["summary"]["fresh"] == "url"
    assert len(other.bodies) == 2 and len({b["cache_salt"] for b in other.bodies}) == 2


# ---- (b) cached_tokens checks ------------------------------------------------------------------------------------

def test_cache_require_cold_fails_when_the_server_reports_cached_tokens(server_with, tmp_path, capsys):
    s = server_with(cached="always")
    rc, rep = bench(s, "cache", "--lengths", "64,128", "--tokens", "4", "--require-cold", out=tmp_path / "c.json")
    assert rc == 1 and validate_report(rep) == []
    assert sum("not cold" in f for f in rep["failures"]) == 2
    assert rep["results"]["lengths"][0]["cached_tokens"] == [48]
    rc, _ = bench(s, "cache", "--lengths", "64", "--tokens", "4")           # not required: only a warning
    assert rc == 0
    assert "warning: 64 tokens: first request reused 48 cached tokens" in capsys.readouterr().out


def test_cache_require_cold_fails_when_cached_tokens_are_not_reported(server_with, capsys):
    s = server_with(cached="absent")
    assert bench(s, "cache", "--lengths", "32", "--tokens", "4", "--require-cold")[0] == 1
    assert "does not report" in capsys.readouterr().out


def test_cache_require_reuse_fails_without_reuse(server_with, capsys):
    s = server_with(cached="never")
    assert bench(s, "cache", "--lengths", "32", "--tokens", "4", "--require-reuse")[0] == 1
    assert "no reuse" in capsys.readouterr().out


def test_cache_salts_every_run_so_a_second_run_is_cold(good, capsys):
    for _ in range(2):
        assert bench(good, "cache", "--lengths", "48,96", "--tokens", "4", "--require-cold")[0] == 0
    # the same salt twice is warm: the simulated prefix cache is real
    assert bench(good, "cache", "--lengths", "48", "--tokens", "4", "--salt", "fixed")[0] == 0
    assert bench(good, "cache", "--lengths", "48", "--tokens", "4", "--salt", "fixed", "--require-cold")[0] == 1


def test_token_arrays_without_tokenize(server_with, tmp_path, capsys):
    s = server_with(tokenize=False)
    rc, rep = bench(s, "cache", "--lengths", "40", "--tokens", "4", out=tmp_path / "c.json")
    assert rc == 0 and rep["results"]["token_source"] == "prompt_token_ids"
    s2 = server_with(tokenize=False, honour_token_ids=False)
    assert bench(s2, "cache", "--lengths", "40", "--tokens", "4")[0] == 2
    rc, rep = bench(s2, "cache", "--lengths", "40", "--tokens", "4", "--vocab-size", "5000",
                    out=tmp_path / "c2.json")
    assert rc == 0 and rep["results"]["token_source"] == "vocab-cycle"


# ---- hashes: from the server, from token_ids, or missing ---------------------------------------------------------

def test_token_sha_falls_back_to_token_ids(server_with, tmp_path, capsys):
    s = server_with(send_token_sha=False)
    rc, rep = bench(s, "decode", "--tokens", "5", "--reps", "2", "--warmup", "0", "--prompts", "chat",
                    out=tmp_path / "d.json")
    assert rc == 0
    cell = rep["results"]["cells"][0]
    assert cell["sha_status"] == "equal" and cell["reps"][0]["token_sha_source"] == "token_ids"


def test_a_missing_hash_is_unverified_never_equal(server_with, tmp_path, capsys):
    s = server_with(send_token_sha=False, honour_token_ids=False)
    rc, rep = bench(s, "concurrent", "--levels", "2", "--tokens", "4", "--alone", "--prompts", "code",
                    out=tmp_path / "c.json")
    assert rc == 0
    assert rep["results"]["summary"]["alone"] == {"equal": 0, "unequal": 0, "unverified": 2, "failed": 0,
                                                   "total": 2}
    assert "0 unequal, 2 unverified" in capsys.readouterr().out
    assert bench(s, "concurrent", "--levels", "2", "--tokens", "4", "--alone", "--prompts", "code",
                 "--strict")[0] == 1
    assert bench(s, "decode", "--tokens", "4", "--reps", "2", "--warmup", "0", "--strict")[0] == 1


# ---- (d) load: failures counted, rate and concurrency bounds ------------------------------------------------------

def test_load_counts_http_errors_and_stream_errors_as_failed(server_with, tmp_path, capsys):
    s = server_with(fail_every=3)                   # requests 3, 9 -> 500; 6, 12 -> 429
    args = ["--num-prompts", "12", "--request-rate", "inf", "--max-concurrency", "1", "--input-len", "16",
            "--output-len", "4"]
    rc, rep = bench(s, "load", *args, out=tmp_path / "l.json")
    assert rc == 1 and validate_report(rep) == []
    res = rep["results"]
    assert (res["completed"], res["failed"]) == (8, 4)
    assert res["errors"] == {"HTTP 500": 2, "HTTP 429": 2}
    assert res["total_input_tokens"] == 8 * 16 and res["total_output_tokens"] == 8 * 4
    assert res["request_throughput"] == pytest.approx(8 / res["duration"])
    rc, rep = bench(s, "load", *args, "--max-failed", "4", out=tmp_path / "l2.json")
    assert rc == 0 and rep["results"]["failed"] == 4
    s2 = server_with(stream_error_every=2)
    rc, rep = bench(s2, "load", "--num-prompts", "6", "--input-len", "8", "--output-len", "6", "--max-failed", "3",
                    out=tmp_path / "l3.json")
    assert rc == 0 and (rep["results"]["completed"], rep["results"]["failed"]) == (3, 3)
    assert list(rep["results"]["errors"]) == ["stream error"]


def test_load_keeps_the_request_rate_within_25_percent(server_with, tmp_path, capsys):
    """Seeded Poisson arrivals at 20 req/s, 60 prompts: the achieved send rate ((n-1) / time from first to last
    send) is within 25% of the target, and within 10% of the seeded schedule's own rate (the scheduler keeps the
    schedule); the double sees the same rate."""
    s = server_with(itl_s=0.002)
    rc, rep = bench(s, "load", "--num-prompts", "60", "--request-rate", "20", "--seed", "0", "--input-len", "16",
                    "--output-len", "4", out=tmp_path / "l.json")
    assert rc == 0
    res = rep["results"]
    sched = arrival_offsets(60, 20.0, 0)
    schedule_rate = 59 / sched[-1]
    assert res["achieved_request_rate"] == pytest.approx(20.0, rel=0.25)
    assert res["achieved_request_rate"] == pytest.approx(schedule_rate, rel=0.10)
    seen = s.state.arrivals
    assert (len(seen) - 1) / (seen[-1] - seen[0]) == pytest.approx(schedule_rate, rel=0.10)
    assert res["completed"] == 60 and res["request_rate"] == 20.0


def test_load_never_exceeds_max_concurrency(server_with, tmp_path, capsys):
    s = server_with(itl_s=0.005)
    rc, rep = bench(s, "load", "--num-prompts", "10", "--request-rate", "inf", "--max-concurrency", "2",
                    "--input-len", "8", "--output-len", "6", out=tmp_path / "l.json")
    assert rc == 0
    assert s.max_in_flight == 2                    # the double counts what it had in flight
    assert rep["results"]["max_in_flight"] == 2


def test_load_metrics_follow_vllm_definitions(good, tmp_path, capsys):
    rc, rep = bench(good, "load", "--num-prompts", "5", "--input-len", "8", "--output-len", "5", "--percentiles",
                    "50,90,99", "--save-detailed", out=tmp_path / "l.json")
    assert rc == 0
    r = rep["results"]
    for m in ("ttft", "tpot", "itl", "e2el"):
        for k in ("mean", "median", "std", "p50", "p90", "p99"):
            assert f"{k}_{m}_ms" in r
    assert len(r["itls"]) == 5 and all(len(x) == 4 for x in r["itls"])      # 5 token chunks -> 4 gaps
    assert r["input_lens"] == [8] * 5 and r["output_lens"] == [5] * 5
    assert r["mean_e2el_ms"] >= r["mean_ttft_ms"]


# ---- exit 2: usage errors and an unreachable server ---------------------------------------------------------------

def test_unreachable_server_exits_2_with_one_line_naming_the_url(capsys):
    rc = main(["decode", "--base-url", "http://127.0.0.1:9/v1", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and "http://127.0.0.1:9/v1" in err and "cannot reach" in err


def test_usage_errors_exit_2(good, capsys):
    with pytest.raises(SystemExit) as e:
        main(["decode", "--tokens", "many"])
    assert e.value.code == 2 and "usage:" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["nope"])
    assert e.value.code == 2
    assert bench(good, "decode", "--model", "other")[0] == 2
    assert "not served" in capsys.readouterr().err
    assert bench(good, "cache", "--lengths", "40000")[0] == 2
    assert "max_model_len" in capsys.readouterr().err
    assert bench(good, "concurrent", "--levels", "0")[0] == 2


def test_python_dash_m_entry_point(good, tmp_path):
    env = {"PYTHONPATH": str(BENCH), "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-m", "cupyglm_bench", "load", "--base-url", good.base_url,
                        "--num-prompts", "3", "--input-len", "8", "--output-len", "3", "--output",
                        str(tmp_path / "l.json")], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "Successful requests" in r.stdout and "\r" not in r.stderr      # no progress bar off a terminal
    assert validate_report(json.loads((tmp_path / "l.json").read_text())) == []


def test_a_server_without_models_needs_model(server_with, tmp_path, capsys):
    s = server_with(models_route=False)
    assert bench(s, "decode", "--tokens", "4", "--reps", "1", "--warmup", "0")[0] == 2
    assert "answered GET /models with HTTP 404" in capsys.readouterr().err
    rc, rep = bench(s, "decode", "--tokens", "4", "--reps", "1", "--warmup", "0", "--model", "fake-glm",
                    out=tmp_path / "d.json")
    assert rc == 0 and rep["server"]["models_entry"] is None and validate_report(rep) == []
