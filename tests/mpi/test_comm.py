"""In-process checks of the distributed layer (no mpirun): rank-order sums, the single-rank world, run_rank_main."""
from __future__ import annotations

import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from cupyglm.distributed.comm import LocalComm, MpiComm, ordered_sum

from procjob import REPO, job_env


def test_ordered_sum_is_left_to_right():
    parts = np.array([[1e8], [1.0], [-1e8], [1.0]], dtype=np.float32)
    assert ordered_sum(parts)[0] == 1.0  # ((1e8 + 1) - 1e8) + 1: 1e8 + 1 rounds to 1e8 in float32
    assert ordered_sum(parts[::-1])[0] == 0.0  # ((1 - 1e8) + 1) + 1e8: another order, other bits
    assert ordered_sum(parts).dtype == np.float32


def test_ordered_sum_bf16_stays_bf16():
    parts = np.ones((3, 4), dtype=ml_dtypes.bfloat16)
    out = ordered_sum(parts)
    assert out.dtype == ml_dtypes.bfloat16 and float(out[0]) == 3.0


def test_local_comm():
    c = LocalComm()
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert np.array_equal(c.allreduce_sum(x), x) and c.allreduce_sum(x) is not x
    assert c.allgather(x).shape == (1, 2, 3)
    assert np.array_equal(c.concat_last(x), x)
    assert c.bcast_bytes(b"abc") == b"abc"
    with pytest.raises(ValueError):
        c.bcast_bytes(None)
    c.barrier()


class FakeMpi:
    """A 3-rank MPI stand-in: Allgather fills every rank's slot from `peers`."""

    def __init__(self, peers):
        self.peers = peers

    def Get_rank(self):
        return 1

    def Get_size(self):
        return len(self.peers)

    def Allgather(self, send, recv):
        n = send.size
        for r, p in enumerate(self.peers):
            recv[r * n:(r + 1) * n] = np.ascontiguousarray(p).reshape(-1).view(np.uint8)


def test_mpi_comm_sums_in_rank_order_and_concats():
    peers = [np.array([1e8, 2], np.float32), np.array([1, 3], np.float32), np.array([-1e8, 4], np.float32)]
    c = MpiComm(FakeMpi(peers))
    assert c.allreduce_sum(peers[1]).tolist() == [0.0, 9.0]
    assert c.concat_last(peers[1]).tolist() == [1e8, 2, 1, 3, -1e8, 4]
    bf = [p.astype(ml_dtypes.bfloat16) for p in peers]
    c = MpiComm(FakeMpi(bf))
    assert c.allgather(bf[1]).dtype == ml_dtypes.bfloat16


def test_single_rank_world_does_not_import_mpi4py():
    code = ("import sys\n"
            "from cupyglm.distributed.world import start\n"
            "from cupyglm.settings import Settings\n"
            "w = start(Settings(backend='numpy'))\n"
            "assert (w.rank, w.size, w.local_rank, w.backend) == (0, 1, 0, 'numpy'), w\n"
            "assert w.settings.model_id == 'builtin-tiny' and w.fingerprint['model'] == 'builtin-tiny'\n"
            "seg = w.shared_segment('solo', 64)\n"
            "assert seg.unlinked_here\n"
            "print('mpi4py' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=job_env(), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def _run_main(body: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    code = ("import sys\n"
            "from cupyglm.distributed.failure import run_rank_main\n"
            "from cupyglm.settings import Settings, SettingsError\n"
            f"def main():\n{body}\n"
            "sys.exit(run_rank_main(main))\n")
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=job_env(env), capture_output=True, text=True,
                          timeout=60)


def test_run_rank_main_single_process():
    out = _run_main("    raise ValueError('bad thing')")
    assert out.returncode == 1 and out.stderr.strip() == "rank 0: ValueError: bad thing"
    out = _run_main("    Settings.from_argv([])", env={"CUPYGLM_KV_HOST": "yes"})
    assert out.returncode == 1
    assert out.stderr.strip() == "REFUSE rank settings: CUPYGLM_KV_HOST must be 0 or 1, got 'yes'"
    out = _run_main("    Settings(kv_host=True, kv_cache='fp8').refuse_unavailable()")
    assert out.returncode == 1
    assert out.stderr.strip() == ("REFUSE rank settings: CUPYGLM_KV_HOST=1 with --kv-cache fp8: host KV rows are "
                                  "bf16 latent rows on pages (use --kv-cache bf16)")
    out = _run_main("    return 0")
    assert out.returncode == 0 and out.stderr == ""
    out = _run_main("    raise ValueError('x')", env={"CUPYGLM_DEBUG": "1"})
    assert "Traceback" in out.stderr and out.stderr.strip().endswith("rank 0: ValueError: x")


def test_run_rank_main_signal_sets_stop_flag():
    body = ("    import os, signal, time\n"
            "    from cupyglm.distributed.failure import stop_requested\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    t = time.monotonic()\n"
            "    while not stop_requested() and time.monotonic() - t < 5: time.sleep(0.01)\n"
            "    print('stopped' if stop_requested() else 'missed')\n")
    out = _run_main(body)
    assert out.returncode == 0 and out.stdout.strip() == "stopped", out.stderr


@pytest.mark.skipif(os.environ.get("CUPYGLM_TEST_NCCL") != "1", reason="needs GPUs (CUPYGLM_TEST_NCCL=1)")
def test_nccl_comm_single_rank():  # pragma: no cover - GPU machines only
    from mpi4py import MPI

    import cupy as cp

    from cupyglm.distributed.comm import NcclComm

    c = NcclComm(MPI.COMM_WORLD, 0)
    x = cp.arange(8, dtype=cp.float32)
    assert cp.array_equal(c.allreduce_sum(x), x)
    assert c.allgather(x).shape == (c.size, 8)
    assert c.bcast_bytes(b"hi" if c.rank == 0 else None) == b"hi"
    c.barrier()
