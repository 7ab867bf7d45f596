"""`mpirun -n 2 cupyglm-generate --backend cuda` through the CuPy double (tests/cupy_double/run.py installs it,
then runs the CLI's main): the real world start, device choice and NcclComm code, NCCL carried over MPI.
Output equal to numpy at TP=2, eager and as graphs with one visible GPU per rank; two ranks on one GPU are
refused by name."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.mpi
RUN = [sys.executable, str(Path(__file__).resolve().parents[1] / "cupy_double" / "run.py"), "--counts"]
ARGS = ["--prompt", "def fib(n):", "--max-tokens", "6", "--kv-pages", "32"]


def _run(mpirun, layout: list[str], timeout=420):
    from procjob import job_env

    env = job_env({"CUPYGLM_CACHE_DIR": os.environ["CUPYGLM_CACHE_DIR"]})
    r = subprocess.run([str(mpirun), *layout], capture_output=True, text=True, env=env, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


def _cuda(*extra):
    return [*RUN, "cupyglm.cli.generate", "--backend", "cuda", *ARGS, *extra]


@pytest.fixture(scope="module")
def numpy_out(mpirun, tiny_dir):
    rc, out, err = _run(mpirun, ["-n", "2", sys.executable, "-m", "cupyglm.cli.generate", "--backend", "numpy",
                                 *ARGS])
    assert rc == 0, err
    assert out.strip()
    return out


def test_tp2_cuda_through_nccl_equals_numpy(mpirun, numpy_out, tmp_path):
    rc, out, err = _run(mpirun, ["-n", "2", RUN[0], RUN[1], "--counts-dir", str(tmp_path), *_cuda()[3:]])
    assert rc == 0, err
    assert out == numpy_out
    lines = {f.name: f.read_text() for f in tmp_path.iterdir()}
    assert sorted(lines) == ["rank-0", "rank-1"], err
    assert all(int(re.search(r"collectives=(\d+)", v)[1]) > 0 for v in lines.values()), lines


def test_two_ranks_on_one_visible_gpu_are_refused(mpirun, tiny_dir):
    rc, out, err = _run(mpirun, ["-n", "2", "-env", "CUDA_VISIBLE_DEVICES", "0", *_cuda()])
    assert rc != 0
    assert "REFUSE devices: rank 0: local ranks [0, 1] all see only the GPU at PCI" in err, err


def test_tp2_cuda_graphs_one_visible_gpu_per_rank_equal_numpy(mpirun, numpy_out, tmp_path):
    """CUPYGLM_CUDA_GRAPHS=1: decode steps replayed as graphs (every layer whole, the DSA maps padded), their
    NCCL calls captured too; and as `srun --gpus-per-task=1`, each rank's CUDA_VISIBLE_DEVICES names its own one
    GPU (device 0 to it)."""
    counted = [RUN[0], RUN[1], "--counts-dir", str(tmp_path), *_cuda()[3:]]
    rc, out, err = _run(mpirun, ["-genv", "CUPYGLM_CUDA_GRAPHS", "1",
                                 "-n", "1", "-env", "CUDA_VISIBLE_DEVICES", "0", *counted, ":",
                                 "-n", "1", "-env", "CUDA_VISIBLE_DEVICES", "1", *counted])
    assert rc == 0, err
    assert out == numpy_out
    lines = {f.name: f.read_text() for f in tmp_path.iterdir()}
    assert sorted(lines) == ["rank-0", "rank-1"], err
    assert all(int(re.search(r"graph_launches=(\d+)", v)[1]) > 0 for v in lines.values()), lines


def test_nccl_rank_sum_is_one_kernel(mpirun):
    """NcclComm on the double at TP=3: allreduce_sum is one allGather and one rank_sum launch (no CuPy kernel), its
    bits the NumPy rank-order sum's (fp32; bf16 rounded each add); a one-row concat_last is one allGather alone."""
    rc, out, err = _run(mpirun, ["-n", "3", RUN[0], RUN[1], "mpi.nccl_sum_job"])
    assert rc == 0, out + err
    assert "f32 True bf16 True row True" in out, out
    assert "collectives 3 launches {'rank_sum_bf16': 1, 'rank_sum_f32': 1} cupy_kernels 0" in out, out
