"""Real `mpirun` jobs of the distributed selfcheck: digests, the settings handshake, failure and shutdown."""
from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from cupyglm.distributed.shm import shm_dir

from .helpers import SELFCHECK, run_job

pytestmark = pytest.mark.mpi

READY = r"rank (\d+): pid (\d+) ready size (\d+) local \d+/\d+ token ([0-9a-f]+) shm (\S+) shm_name_left (\d) " \
        r"handshake_ms ([0-9.]+)"
KV_HOST_LINE = ("REFUSE rank settings: rank 1's kv_host differs from rank 0's "
                "(--kv-host or CUPYGLM_KV_HOST or --kv-host-shared or CUPYGLM_KV_HOST_SHARED)")


def digests(out: str) -> list[str]:
    return re.findall(r"DIGEST ([0-9a-f]{16})", out)


def leftovers(token: str) -> list[str]:
    return sorted(p.name for p in shm_dir().glob(f"cupyglm-{token}-*"))


def mpmd(rank0: list[str], rank1: list[str], env0: dict[str, str] | None = None,
         env1: dict[str, str] | None = None) -> list[str]:
    """Hydra MPMD: `-n 1 [-env K V]... cmd : -n 1 [-env K V]... cmd`."""
    def part(extra: list[str], env: dict[str, str] | None) -> list[str]:
        flags = [x for k, v in (env or {}).items() for x in ("-env", k, v)]
        return ["-n", "1", *flags, *SELFCHECK, *extra]
    return [*part(rank0, env0), ":", *part(rank1, env1)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 4])
def test_digests_agree_and_repeat(launch, n):
    seen = []
    for _ in range(2):
        rc, out, _ = run_job(launch, ["-n", str(n), *SELFCHECK, "--seed", "11"])
        assert rc == 0, out
        d = digests(out)
        assert len(d) == n and len(set(d)) == 1, out
        seen.append(d[0])
        ready = re.findall(READY, out)
        assert sorted(int(r[0]) for r in ready) == list(range(n)), out
        assert {r[3] for r in ready} and len({r[3] for r in ready}) == 1, "every rank has rank 0's token"
        assert all(r[5] == "0" for r in ready), "the segment's name is gone once every rank mapped it"
        assert leftovers(ready[0][3]) == []
        assert out.count("done after 0 steps") == n
    assert seen[0] == seen[1], "bit-identical run to run"


@pytest.mark.timeout(60)
def test_handshake_cost_reported(launch):
    rc, out, _ = run_job(launch, ["-n", "2", *SELFCHECK])
    assert rc == 0, out
    ms = [float(r[6]) for r in re.findall(READY, out)]
    assert len(ms) == 2 and all(0 < m < 2000 for m in ms), out
    print(f"handshake at TP=2: {max(ms):.3f} ms")


def _assert_refused(rc: int, out: str, took: float, line: str) -> None:
    assert rc != 0, out
    assert took < 10, f"took {took:.1f} s"
    lines = [ln for ln in out.splitlines() if "REFUSE" in ln]
    assert lines == [line], out
    assert "DIGEST" not in out and "Traceback" not in out, out


@pytest.mark.timeout(60)
def test_refuses_env_mismatch(launch):
    rc, out, took = run_job(launch, mpmd([], [], env0={"CUPYGLM_KV_HOST": "1"}), timeout=30)
    _assert_refused(rc, out, took, KV_HOST_LINE)


@pytest.mark.timeout(60)
def test_refuses_shared_mismatch_naming_both_variables(launch):
    rc, out, took = run_job(launch, mpmd([], [], env0={"CUPYGLM_KV_HOST": "1"},
                                         env1={"CUPYGLM_KV_HOST": "1", "CUPYGLM_KV_HOST_SHARED": "1"}), timeout=30)
    _assert_refused(rc, out, took, KV_HOST_LINE)


@pytest.mark.timeout(60)
def test_refuses_flag_mismatch(launch):
    rc, out, took = run_job(launch, mpmd(["--context", "1024"], ["--context", "2048"]), timeout=30)
    _assert_refused(rc, out, took, "REFUSE rank settings: rank 1's context differs from rank 0's (--context)")


@pytest.mark.timeout(60)
def test_refuses_other_env_mismatch(launch):
    rc, out, took = run_job(launch, mpmd([], [], env1={"CUPYGLM_MEMORY_RESERVE_GIB": "2"}), timeout=30)
    _assert_refused(rc, out, took, "REFUSE rank settings: rank 1's memory_reserve_gib differs from rank 0's "
                                   "(--memory-reserve-gib or CUPYGLM_MEMORY_RESERVE_GIB)")


def _config(dir_: Path, layers: int) -> str:
    dir_.mkdir()
    (dir_ / "config.json").write_text(json.dumps({"num_hidden_layers": layers}))
    return str(dir_)


@pytest.mark.timeout(60)
def test_refuses_model_identity_mismatch(launch, tmp_path):
    a, b = _config(tmp_path / "a", 8), _config(tmp_path / "b", 9)
    rc, out, took = run_job(launch, mpmd(["--model", a], ["--model", b]), timeout=30)
    _assert_refused(rc, out, took, "REFUSE rank settings: rank 1's model differs from rank 0's (--model)")


@pytest.mark.timeout(60)
def test_same_config_bytes_in_two_dirs_agree(launch, tmp_path):
    a, b = _config(tmp_path / "a", 8), _config(tmp_path / "b", 8)
    rc, out, _ = run_job(launch, mpmd(["--model", a], ["--model", b]), timeout=30)
    assert rc == 0, out
    assert len(set(digests(out))) == 1


@pytest.mark.timeout(60)
@pytest.mark.parametrize("env1, line", [
    ({"CUPYGLM_KV_HOST": "2"}, "CUPYGLM_KV_HOST must be 0 or 1, got '2'"),
    ({"CUPYGLM_KV_HOST_SHARED": "1"}, "CUPYGLM_KV_HOST_SHARED=1 needs CUPYGLM_KV_HOST=1"),
    ({"CUPYGLM_KV_HOST": "1", "CUPYGLM_KV_HOST_GIB": "-3"}, "CUPYGLM_KV_HOST_GIB must be a positive number, got '-3'"),
    ({"CUPYGLM_KV_HOST_GIB": "4"}, "CUPYGLM_KV_HOST_GIB needs CUPYGLM_KV_HOST=1"),
])
def test_refuses_invalid_value_on_one_rank(launch, env1, line):
    rc, out, took = run_job(launch, mpmd([], [], env1=env1), timeout=30)
    _assert_refused(rc, out, took, "REFUSE rank settings: " + line)


@pytest.mark.timeout(60)
def test_refuses_invalid_flag_on_rank_0(launch):
    rc, out, took = run_job(launch, mpmd(["--page-tokens", "6"], []), timeout=30)
    _assert_refused(rc, out, took, "REFUSE rank settings: --page-tokens must be 0 (the model's default) or a positive "
                                   "multiple of 4, got 6")


@pytest.mark.timeout(60)
def test_refuses_missing_model_dir(launch, tmp_path):
    rc, out, took = run_job(launch, ["-n", "2", *SELFCHECK, "--model", str(tmp_path / "nowhere")], timeout=30)
    _assert_refused(rc, out, took, f"REFUSE rank settings: --model {tmp_path / 'nowhere'}: no config.json there")


@pytest.mark.timeout(60)
def test_unavailable_refused_once_after_handshake(launch):
    rc, out, took = run_job(launch, ["-n", "2", "-genv", "CUPYGLM_KV_HOST", "1", *SELFCHECK, "--kv-cache", "fp8"],
                            timeout=30)
    _assert_refused(rc, out, took, "REFUSE rank settings: CUPYGLM_KV_HOST=1 with --kv-cache fp8: host KV rows are "
                                   "bf16 latent rows on pages (use --kv-cache bf16)")


@pytest.mark.timeout(60)
def test_rank_that_raises_ends_the_job(launch):
    rc, out, took = run_job(launch, ["-n", "2", *SELFCHECK, "--loop-seconds", "60", "--fail-rank", "1",
                                     "--fail-after", "0.5"], timeout=30)
    assert rc != 0, out
    assert took < 10, f"took {took:.1f} s"
    assert out.count("RuntimeError: planted failure on rank 1") == 1, out
    assert "rank 1: RuntimeError: planted failure on rank 1" in out
    assert "Traceback" not in out


@pytest.mark.timeout(60)
def test_error_every_rank_hits_is_printed_once(launch):
    # Every rank fails the same way right after startup: rank 0 prints, its Abort ends the others first.
    rc, out, took = run_job(launch, ["-n", "4", *SELFCHECK, "--fail-rank", "-2"], timeout=30)
    assert rc != 0 and took < 10, out
    assert out.count("planted failure") == 1, out
    assert "rank 0: RuntimeError: planted failure on rank 0" in out


@pytest.mark.timeout(60)
def test_rank_0_failing_alone_ends_the_job(launch):
    rc, out, took = run_job(launch, ["-n", "2", *SELFCHECK, "--fail-rank", "0"], timeout=30)
    assert rc != 0 and took < 10, out
    assert out.count("rank 0: RuntimeError: planted failure on rank 0") == 1, out


@pytest.mark.timeout(60)
def test_debug_prints_traceback(launch):
    rc, out, _ = run_job(launch, ["-n", "2", "-genv", "CUPYGLM_DEBUG", "1", *SELFCHECK, "--fail-rank", "1"],
                         timeout=30)
    assert rc != 0
    assert "Traceback" in out and "rank 1: RuntimeError: planted failure on rank 1" in out, out


@pytest.mark.timeout(60)
def test_sigkilled_rank_ends_the_job_and_leaves_no_segment(launch):
    job = launch(["-n", "2", *SELFCHECK, "--loop-seconds", "60"])
    ready = job.wait_for(READY, count=2)
    token = ready[0].group(4)
    pid1 = next(int(m.group(2)) for m in ready if m.group(1) == "1")
    job.wait_for(r"DIGEST", count=2)
    t_kill = time.monotonic()
    os.kill(pid1, signal.SIGKILL)
    rc, _ = job.wait(timeout=15)
    assert rc != 0, job.output
    assert time.monotonic() - t_kill < 10, "the job ends within 10 s of the kill"
    assert leftovers(token) == [], "no segment of the job is left in /dev/shm"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_mpirun_stops_every_rank_cleanly(launch, sig):
    job = launch(["-n", "2", *SELFCHECK, "--loop-seconds", "60"])
    job.wait_for(r"DIGEST", count=2)
    t_sig = time.monotonic()
    job.proc.send_signal(sig)
    rc, _ = job.wait(timeout=15)
    assert rc == 0, job.output
    assert time.monotonic() - t_sig < 10
    assert len(re.findall(r"rank \d: done after (\d+) steps", job.output)) == 2, job.output
    steps = set(re.findall(r"done after (\d+) steps", job.output))
    assert len(steps) == 1, "both ranks left at the same step"


@pytest.mark.timeout(60)
def test_single_rank_under_mpirun(launch):
    rc, out, _ = run_job(launch, ["-n", "1", *SELFCHECK], timeout=30)
    assert rc == 0, out
    assert len(digests(out)) == 1


@pytest.mark.timeout(60)
def test_usage_error_on_one_rank_ends_the_job(launch):
    rc, out, took = run_job(launch, mpmd([], ["--no-such-flag"]), timeout=30)
    assert rc != 0 and took < 10, out
    assert "unrecognized arguments: --no-such-flag" in out


# A rank of a build with another ARITHMETIC (its reduction orders or roundings changed): its bits would differ.
OTHER_ARITHMETIC = ("import sys; from cupyglm.backend import arithmetic; arithmetic.ARITHMETIC += 1; "
                    "from cupyglm.distributed.selfcheck import main; sys.exit(main(sys.argv[1:]))")


@pytest.mark.timeout(60)
def test_refuses_a_rank_of_another_arithmetic(launch):
    other = [SELFCHECK[0], "-c", OTHER_ARITHMETIC, *SELFCHECK[3:]]
    rc, out, took = run_job(launch, ["-n", "1", *SELFCHECK, ":", "-n", "1", *other], timeout=30)
    _assert_refused(rc, out, took, "REFUSE rank settings: rank 1's arithmetic differs from rank 0's "
                                   "(the cupyglm build's ARITHMETIC version and the GPU's tensor core)")
