"""`cupy.cuda.nccl` of the double: NCCL collectives carried over MPI (mpi4py), on the double's device memory.

Buffers are passed as raw device pointers (x.data.ptr), as with NCCL; a pointer (and count) must lie inside
one live double allocation, else the call raises as NCCL would on a host pointer. The communicator of
NcclCommunicator(n, uid, rank) is MPI.COMM_WORLD's: n and rank must match it.
"""
from __future__ import annotations

import ctypes
import os

import numpy as np

from . import capture
from .state import STATE

NCCL_INT8, NCCL_UINT8, NCCL_INT32, NCCL_UINT32, NCCL_INT64, NCCL_UINT64 = 0, 1, 2, 3, 4, 5
NCCL_FLOAT16, NCCL_FLOAT32, NCCL_FLOAT64, NCCL_BFLOAT16 = 6, 7, 8, 9
NCCL_CHAR, NCCL_INT, NCCL_HALF, NCCL_FLOAT, NCCL_DOUBLE = NCCL_INT8, NCCL_INT32, NCCL_FLOAT16, NCCL_FLOAT32, NCCL_FLOAT64
NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN = 0, 1, 2, 3
_DTYPES = {NCCL_INT8: np.int8, NCCL_UINT8: np.uint8, NCCL_INT32: np.int32, NCCL_UINT32: np.uint32,
           NCCL_INT64: np.int64, NCCL_UINT64: np.uint64, NCCL_FLOAT16: np.float16, NCCL_FLOAT32: np.float32,
           NCCL_FLOAT64: np.float64, NCCL_BFLOAT16: np.uint16}


class NcclError(RuntimeError):
    pass


def get_unique_id():
    return tuple(int(b) for b in os.urandom(128))


def get_version() -> int:
    return 22000


def _view(ptr: int, count: int, dtype: int, what: str) -> np.ndarray:
    dt = np.dtype(_DTYPES[dtype])
    nbytes = int(count) * dt.itemsize
    if not STATE.owns(int(ptr), nbytes):
        raise NcclError(f"NCCL_ERROR_INVALID_ARGUMENT: {what} 0x{int(ptr):x} (+{nbytes} B) is not device memory")
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(int(ptr))).view(dt)


class NcclCommunicator:
    def __init__(self, ndev: int, commId, rank: int):
        from mpi4py import MPI

        self._mpi = MPI.COMM_WORLD.Dup()
        if self._mpi.Get_size() != ndev or self._mpi.Get_rank() != rank:
            raise NcclError(f"NCCL_ERROR_INVALID_ARGUMENT: {ndev} ranks / rank {rank} do not match the MPI world "
                            f"({self._mpi.Get_size()} / {self._mpi.Get_rank()})")
        import socket

        from . import cuda

        me = (socket.gethostname(), cuda.runtime.getDeviceProperties()["pciBusID"])
        got = self._mpi.allgather((tuple(commId), me))
        if any(i != got[0][0] for i, _ in got):
            raise NcclError("NCCL_ERROR_INVALID_ARGUMENT: ranks passed different unique ids")
        if [d for _, d in got].count(me) > 1:
            raise NcclError(f"NCCL_ERROR_INVALID_USAGE: Duplicate GPU detected: rank {rank} and another rank use "
                            f"the same device (PCI bus {me[1]:#x} on {me[0]})")
        self._rank, self._size = rank, ndev

    def rank_id(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def allGather(self, sendbuf, recvbuf, count, datatype, stream):
        send = _view(sendbuf, count, datatype, "sendbuf")
        recv = _view(recvbuf, count * self._size, datatype, "recvbuf")
        run = lambda: self._mpi.Allgather(send.view(np.uint8).copy(), recv.view(np.uint8))  # noqa: E731
        if not capture.record("collectives", "allGather", run):        # NCCL calls are captured too
            STATE.count("collectives", what="allGather")
            run()

    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):
        from mpi4py import MPI

        send = _view(sendbuf, count, datatype, "sendbuf")
        recv = _view(recvbuf, count, datatype, "recvbuf")
        ops = {NCCL_SUM: MPI.SUM, NCCL_PROD: MPI.PROD, NCCL_MAX: MPI.MAX, NCCL_MIN: MPI.MIN}
        run = lambda: self._mpi.Allreduce(send.copy(), recv, op=ops[op])  # noqa: E731
        if not capture.record("collectives", "allReduce", run):
            STATE.count("collectives", what="allReduce")
            run()

    def bcast(self, buff, count, datatype, root, stream):
        buf = _view(buff, count, datatype, "buff")
        capture.refuse("an NCCL broadcast (the double captures allGather and allReduce only)")
        STATE.count("collectives", what="bcast")
        self._mpi.Bcast(buf.view(np.uint8), root=root)

    def broadcast(self, sendbuf, recvbuf, count, datatype, root, stream):
        send = _view(sendbuf, count, datatype, "sendbuf")
        recv = _view(recvbuf, count, datatype, "recvbuf")
        if self._rank == root:
            recv[...] = send
        self.bcast(recvbuf, count, datatype, root, stream)
        STATE.counts["collectives"] -= 1

    def destroy(self):
        self._mpi.Free()

    def abort(self):
        self.destroy()
