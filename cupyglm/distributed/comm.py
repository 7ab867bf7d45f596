"""Communicators: the collectives the model and engine use, with cross-rank sums added in rank order.

Every communicator has `rank`, `size`, `allreduce_sum`, `allgather`, `concat_last`, `bcast_bytes`, `barrier`.
`allreduce_sum` gathers every rank's partial and adds them left to right, ((p0 + p1) + p2) + p3, in the array's
dtype, so the sum is bit-identical on every rank and run to run (a library allreduce may pick its order by
message size or topology). A sublayer takes `gathered(comm, partial)` instead: the parts alone, which hc_post adds
in the same order as it reads them (no sum kernel).

- LocalComm: one rank, no MPI.
- MpiComm: mpi4py on numpy arrays (the CPU backends); arrays travel as raw bytes, so bf16 (ml_dtypes) works.
- NcclComm: cupy arrays over NCCL (cupy.cuda.nccl), its unique id broadcast by MPI; host bytes go over MPI; the
  rank-order sum is one kernel (cuda_src/rank_sum.cu).
"""
from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from cupyglm.backend.lanes import rank_sum
from cupyglm.distributed import idle
from cupyglm.kernels import ops_rank_sum
from cupyglm.kernels.ops import Kernels


class Comm(Protocol):
    rank: int
    size: int

    def allreduce_sum(self, x: Any) -> Any: ...
    def allgather(self, x: Any) -> Any: ...
    def concat_last(self, x: Any) -> Any: ...
    def bcast_bytes(self, b: bytes | None) -> bytes: ...
    def barrier(self) -> None: ...


def summed(comm: "Comm", partial: Any) -> Any:
    """The all-reduced sum of a sublayer's fresh partial: on a single rank the partial is the sum itself (no copy
    kernel); the caller only reads the result."""
    return partial if comm.size == 1 else comm.allreduce_sum(partial)


def gathered(comm: "Comm", partial: Any) -> Any:
    """A sublayer's fresh partial [T, D] as hc_post takes it: every rank's, gathered in rank order into [R, T, D]
    (one collective, no sum kernel: hc_post adds them in rank order as it reads them, the bits of ordered_sum);
    on a single rank the partial itself."""
    return partial if comm.size == 1 else comm.allgather(partial)


def ordered_sum(parts: Any) -> Any:
    """parts[0] + parts[1] + ... added left to right in parts' dtype (numpy; backend.lanes.rank_sum)."""
    return rank_sum(parts)


class LocalComm:
    """The communicator of a single-rank world."""

    rank = 0
    size = 1

    def allreduce_sum(self, x: np.ndarray) -> np.ndarray:
        return x.copy()

    def allgather(self, x: np.ndarray) -> np.ndarray:
        return x[None].copy()

    def concat_last(self, x: np.ndarray) -> np.ndarray:
        return x.copy()

    def bcast_bytes(self, b: bytes | None) -> bytes:
        if b is None:
            raise ValueError("bcast_bytes: rank 0 must pass the bytes")
        return bytes(b)

    def barrier(self) -> None:
        pass


class MpiComm:
    """mpi4py collectives on numpy arrays."""

    def __init__(self, mpi_comm: Any):
        self.mpi = mpi_comm
        self.rank = mpi_comm.Get_rank()
        self.size = mpi_comm.Get_size()

    def allgather(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x)
        out = np.empty((self.size,) + x.shape, dtype=x.dtype)
        send = x.reshape(-1).view(np.uint8)
        recv = out.reshape(-1).view(np.uint8)
        if send.size:
            self.mpi.Allgather(send, recv)
        return out

    def allreduce_sum(self, x: np.ndarray) -> np.ndarray:
        return ordered_sum(self.allgather(x))

    def concat_last(self, x: np.ndarray) -> np.ndarray:
        parts = self.allgather(x)
        return np.concatenate(list(parts), axis=-1)

    def bcast_bytes(self, b: bytes | None) -> bytes:
        n = np.array([len(b) if self.rank == 0 and b is not None else -1], dtype=np.int64)
        if self.rank == 0 and b is None:
            raise ValueError("bcast_bytes: rank 0 must pass the bytes")
        # the length travels by a nonblocking broadcast on every rank (nonblocking and blocking collectives do
        # not match): a rank waiting for the next message naps instead of busy-polling (cupyglm.distributed.idle)
        req = self.mpi.Ibcast(n, root=0)
        if self.rank == 0:
            req.Wait()
        else:
            idle.wait(req)
        buf = np.frombuffer(bytearray(b), dtype=np.uint8) if self.rank == 0 else np.empty(int(n[0]), dtype=np.uint8)
        if n[0]:
            self.mpi.Bcast(buf, root=0)
        return buf.tobytes()

    def barrier(self) -> None:
        self.mpi.Barrier()


class NcclComm:
    """NCCL collectives on cupy arrays of the current device; rank order as MpiComm. Needs a GPU per rank.

    `mpi_comm` (mpi4py) carries the NCCL unique id and host bytes. Collectives run on the current stream.
    """

    def __init__(self, mpi_comm: Any, device_index: int):
        import cupy
        from cupy.cuda import nccl

        self._cupy = cupy
        self._nccl = nccl
        self.host = MpiComm(mpi_comm)
        self.rank = self.host.rank
        self.size = self.host.size
        self.device_index = device_index
        cupy.cuda.Device(device_index).use()
        uid = nccl.get_unique_id() if self.rank == 0 else None
        uid = mpi_comm.bcast(uid, root=0)
        self.nccl = nccl.NcclCommunicator(self.size, uid, self.rank)
        self._kernels = Kernels("cuda", cupy)       # the rank-order sum's kernel (cuda_src/rank_sum.cu)

    def _stream(self) -> int:
        return self._cupy.cuda.get_current_stream().ptr

    def allgather(self, x: Any) -> Any:
        cp = self._cupy
        x = cp.ascontiguousarray(x)
        out = cp.empty((self.size,) + x.shape, dtype=x.dtype)
        if x.nbytes:
            # Bytes, so every dtype (bf16 included) travels unchanged.
            self.nccl.allGather(x.data.ptr, out.data.ptr, x.nbytes, self._nccl.NCCL_UINT8, self._stream())
        return out

    def allreduce_sum(self, x: Any) -> Any:
        """One allGather, then the parts added in rank order by one kernel (fp32, or bf16 as uint16 bits)."""
        return ops_rank_sum.rank_sum(self._kernels, self.allgather(x))

    def concat_last(self, x: Any) -> Any:
        """One allGather; with one leading row the rank-major gather already is the concatenation (no copy)."""
        parts = self.allgather(x)
        if x.ndim and x.size == x.shape[-1]:
            return parts.reshape(x.shape[:-1] + (self.size * x.shape[-1],))
        return self._cupy.concatenate(list(parts), axis=-1)

    def bcast_bytes(self, b: bytes | None) -> bytes:
        return self.host.bcast_bytes(b)

    def barrier(self) -> None:
        self._cupy.cuda.get_current_stream().synchronize()
        self.host.barrier()
