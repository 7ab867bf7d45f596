"""cupyglm-bench end to end against the real tiny server (`mpirun -n 2 python -m cupyglm.cli.serve`, numpy backend):
every subcommand with small sizes passes and writes a report that validates."""
from __future__ import annotations

import json

import pytest

from cupyglm_bench.cli import main
from cupyglm_bench.report import validate_report


pytestmark = pytest.mark.mpi

RUNS = {
    "decode": ["--tokens", "16", "--reps", "2", "--warmup", "0"],
    "cache": ["--lengths", "64,128", "--tokens", "8", "--require-cold"],
    "concurrent": ["--levels", "1,2", "--tokens", "8", "--alone"],
    "resume": ["--turns", "3", "--max-tokens", "8", "--system", "short"],
    "load": ["--num-prompts", "8", "--request-rate", "8", "--max-concurrency", "4", "--input-len", "32",
             "--output-len", "8", "--percentiles", "50,90"],
}


@pytest.fixture(scope="module")
def bench_server(start_server):
    s = start_server(["--context", "512", "--parallel", "4", "--max-queue", "16"])
    yield s
    s.kill()


@pytest.mark.parametrize("sub", list(RUNS))
def test_subcommand_passes_against_the_real_server(bench_server, sub, tmp_path, capsys):
    out = tmp_path / f"{sub}.json"
    rc = main([sub, "--base-url", bench_server.url, "--no-progress", "--output", str(out), *RUNS[sub]])
    printed = capsys.readouterr()
    assert rc == 0, printed.out + printed.err
    rep = json.loads(out.read_text())
    assert validate_report(rep) == []
    assert rep["passed"] and rep["server"]["model"] == bench_server.model
    assert rep["server"]["models_entry"]["max_model_len"] == 512
    res = rep["results"]
    if sub == "decode":
        assert all(c["sha_status"] == "equal" and c["reps"][0]["token_sha_source"] == "server"
                   for c in res["cells"])
        assert all(c["completion_tokens"] == 16 for c in res["cells"])
    elif sub == "cache":
        assert [d["prompt_tokens"] for d in res["lengths"]] == [64, 128]
        assert all(d["cached_tokens"] == [0] for d in res["lengths"])
    elif sub == "concurrent":
        assert res["summary"]["alone"]["equal"] == res["summary"]["alone"]["total"] == 6
    elif sub == "resume":
        assert [t["status"] for t in res["turns"]] == ["equal"] * 3
    else:
        assert (res["completed"], res["failed"]) == (8, 0)
        assert res["total_input_tokens"] == 8 * 32 and res["total_output_tokens"] == 8 * 8
        assert res["max_in_flight"] <= 4


def test_decode_prints_the_kv_host_row_cache(start_server, tmp_path, capsys):
    """With CUPYGLM_KV_HOST=1 on every rank, `decode` reports the row cache's hit rate over its requests and the
    bytes a decode token moved, read from the server's /metrics."""
    s = start_server(["--context", "512", "--parallel", "2"], env={"CUPYGLM_KV_HOST": "1"})
    try:
        out = tmp_path / "decode.json"
        rc = main(["decode", "--base-url", s.url, "--no-progress", "--output", str(out), *RUNS["decode"]])
        printed = capsys.readouterr()
        assert rc == 0, printed.out + printed.err
        rep = json.loads(out.read_text())
        assert validate_report(rep) == []
        host = rep["results"]["kv_host"]
        assert host["hits"] > 0 and host["misses"] > 0 and 0 < host["hit_rate"] < 1
        assert host["bytes_per_decode_token"] > 0
        assert "kv host rows" in printed.out and "hit rate" in printed.out
    finally:
        s.kill()
