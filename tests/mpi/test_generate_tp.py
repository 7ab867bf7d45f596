"""cupyglm-generate under real `mpirun`: TP=2/4 runs repeat exactly; mismatched ranks refuse before weights."""
import os
import shutil
import signal
import sys
import time

import pytest

from .helpers import run_job

pytestmark = pytest.mark.mpi
GENERATE = [sys.executable, "-m", "cupyglm.cli.generate", "--backend", "numpy"]


def _cache():
    return {"CUPYGLM_CACHE_DIR": os.environ["CUPYGLM_CACHE_DIR"]}


@pytest.mark.parametrize("n", [2, 4])
def test_tp_generate_repeats_exactly(mpirun, tiny_dir, n):
    """stdout (the generated text) is compared alone: stderr's log lines interleave with it differently."""
    import subprocess

    from procjob import job_env

    args = [str(mpirun), "-n", str(n), *GENERATE, "--prompt", "def fib(n):", "--max-tokens", "16"]
    runs = [subprocess.run(args, capture_output=True, text=True, env=job_env(_cache()), timeout=120)
            for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"tp {n}" in r.stderr
    assert runs[0].stdout == runs[1].stdout
    assert runs[0].stdout.strip()


def test_mpmd_refusal_comes_before_any_weight_is_read(launch, tiny_dir, tmp_path):
    """Rank 0 sets CUPYGLM_KV_HOST=1, rank 1 does not; the checkpoint's weights are corrupt, so reaching the
    loader would print a checkpoint error instead of the refusal."""
    bad = tmp_path / "ckpt"
    shutil.copytree(tiny_dir, bad)
    for f in bad.glob("*.safetensors"):
        f.write_bytes(b"\0" * 16)
    gen = [*GENERATE, "--model", str(bad), "--prompt", "x"]
    rc, out, took = run_job(launch, ["-n", "1", "-env", "CUPYGLM_KV_HOST", "1", *gen, ":", "-n", "1", *gen],
                            _cache(), timeout=30)
    assert rc != 0
    assert ("REFUSE rank settings: rank 1's kv_host differs from rank 0's "
            "(--kv-host or CUPYGLM_KV_HOST or --kv-host-shared or CUPYGLM_KV_HOST_SHARED)") in out
    assert "safetensors" not in out
    assert took < 20


def _descendants(pid: int) -> list[int]:
    """Every process below pid, from /proc (no psutil)."""
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    out, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        frontier += kids
    return out


def _rank_pids(pid: int) -> list[int]:
    ranks = []
    for p in _descendants(pid):
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                if b"cupyglm.cli.generate" in f.read():
                    ranks.append(p)
        except OSError:
            continue
    return ranks


def test_sigkill_of_a_rank_ends_the_job(launch, tiny_dir):
    job = launch(["-n", "2", *GENERATE, "--prompt", "a" * 50, "--max-tokens", "2000", "--context", "4096"],
                 _cache())
    job.wait_for(r"tp 2", timeout=60)
    time.sleep(1.0)
    ranks = _rank_pids(job.proc.pid)
    assert len(ranks) == 2, ranks
    t_kill = time.monotonic()
    os.kill(max(ranks), signal.SIGKILL)
    rc, _ = job.wait(timeout=30)
    assert rc != 0
    assert time.monotonic() - t_kill < 10, "the job ends within 10 s of the kill"


@pytest.mark.parametrize("n", [2, 4])
def test_tp_logits_repeat_and_stay_near_tp1(launch, tiny_ckpt, tmp_path, n):
    """Real ranks: bit-identical run to run; within the tolerance stated in test_model_exactness of TP=1."""
    import numpy as np

    from cupyglm.model.glm import SeqInput
    from model_helpers import build_models

    script = os.path.join(os.path.dirname(__file__), "tp_logits.py")
    outs = []
    for i in range(2):
        path = tmp_path / f"logits{i}.npy"
        rc, out, _ = run_job(launch, ["-n", str(n), sys.executable, script, str(path)], _cache(), timeout=120)
        assert rc == 0, out
        outs.append(np.load(path))
    assert np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32))
    m = build_models(tiny_ckpt, tp=1)[0]
    ref = m.forward([SeqInput(np.arange(100, 150, dtype=np.int32), m.new_state(), all_logits=True)])[0].logits
    row_diff = np.max(np.abs(outs[0] - ref), axis=1)
    print(f"mpirun tp={n}: median row diff {np.median(row_diff):.4g}, max {row_diff.max():.4g}")
    assert np.median(row_diff) <= 0.05 * np.max(np.abs(ref))
    assert np.mean(np.argmax(outs[0], axis=1) == np.argmax(ref, axis=1)) >= 0.8
