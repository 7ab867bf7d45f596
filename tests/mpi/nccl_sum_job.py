"""Run under mpirun through tests/cupy_double/run.py: NcclComm's rank-order sum and vocab gather on the double's
device memory, checked on every rank against the NumPy rank-order sum; prints one line per check on rank 0."""
from __future__ import annotations

import numpy as np

from cupyglm.backend.lanes import bf16, from_bits, to_bits
from cupyglm.distributed.comm import NcclComm, ordered_sum

# rank r's planted partial: large terms that cancel, so another order of the ranks gives other bits
PLANT = (1e8, 1.0, -1e8, 1.0, 3e-3, -7.5)


def _part(rank: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(rank)
    v = (rng.standard_normal(n) * 10.0 ** rng.uniform(-4, 4, n)).astype(np.float32)
    v[0] = PLANT[rank % len(PLANT)]
    return v


def main(argv: list[str]) -> int:
    import cupy
    import cupy_double
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    comm = NcclComm(world, world.Get_rank())
    n = 1000
    every = np.stack([_part(r, n) for r in range(comm.size)])                    # [R, n] f32, every rank's part
    mine = cupy.asarray(every[comm.rank])
    bits = cupy.asarray(to_bits(bf16(every[comm.rank])))                         # bf16 as uint16 bit patterns
    comm.allreduce_sum(mine)                                                    # warm-up: the kernels load
    comm.allreduce_sum(bits)
    with cupy_double.counting(trace=True) as c:
        total = comm.allreduce_sum(mine)
        total_bf = comm.allreduce_sum(bits)
        row = comm.concat_last(mine[None, :8])                                  # [1, 8 R]: one vocab row
    got_f32 = cupy.asnumpy(total)
    got_bf = from_bits(cupy.asnumpy(total_bf))
    same_f32 = got_f32.tobytes() == ordered_sum(every).tobytes()
    same_bf = got_bf.tobytes() == ordered_sum(bf16(every)).tobytes()
    same_row = np.array_equal(cupy.asnumpy(row), every[:, :8].reshape(1, -1))
    if comm.rank == 0:
        print(f"f32 {same_f32} bf16 {same_bf} row {same_row}")
        print(f"collectives {c.collectives} launches {dict(sorted(c.where.get('launches', {}).items()))} "
              f"cupy_kernels {c.kernels}")
    return 0 if same_f32 and same_bf and same_row else 1
