"""The world of ranks: `start(settings)` is the first thing every CLI calls.

Not started by an MPI launcher: a single-rank world, without importing mpi4py. Under mpirun/srun: mpi4py, the
fingerprint handshake (every rank refuses together on a difference, before any weight is read), the node-local
rank (`Split_type(COMM_TYPE_SHARED)`, which is the device index on cuda) and the communicator of the backend.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from cupyglm import env
from cupyglm.distributed import fingerprint as fpmod
from cupyglm.distributed import mpich_shm
from cupyglm.distributed.comm import Comm, LocalComm, MpiComm
from cupyglm.distributed.shm import SharedSegment, new_token, open_local
from cupyglm.settings import Settings, SettingsError

_STATE = {"handshake_done": False}


@dataclasses.dataclass(frozen=True, eq=False)
class World:
    rank: int
    size: int
    local_rank: int                 # node-local rank
    local_size: int
    comm: Comm                      # the backend's communicator (NcclComm on cuda with size > 1)
    settings: Settings              # with model_id filled
    backend: str                    # the resolved backend: numpy|sim|cuda
    token: str                      # per-launch token from rank 0 (shared-memory names)
    fingerprint: dict[str, Any]
    fingerprint_hash: str
    handshake_ms: float             # wall time of the handshake's all-gather and decision (0 for one rank)
    mpi: Any = None                 # mpi4py COMM_WORLD, None in a single-rank world
    local_mpi: Any = None           # mpi4py node-local communicator, None in a single-rank world
    host_comm: Comm | None = None   # MpiComm/LocalComm for host arrays and bytes, whatever the backend
    device: int = 0                 # this rank's CUDA device among those it sees (distributed/devices.py); 0 off cuda
    before_map: Callable[[int, str], None] | None = None   # an observer of shared segments (shm.open_local; tests)

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    @property
    def device_index(self) -> int:
        return self.device

    def shared_segment(self, purpose: str, nbytes: int) -> SharedSegment:
        """A /dev/shm segment mapped by every rank of this host (collective over the host's ranks). Its name
        carries the world rank of the host's first rank, so two hosts that share one /dev/shm never meet."""
        first = self.local_mpi.bcast(self.rank, root=0) if self.local_mpi is not None else self.rank
        return open_local(self.token, f"{purpose}_n{first}", nbytes, local_rank=self.local_rank,
                          local_size=self.local_size, local_comm=self.local_mpi, fingerprint_hash=self.fingerprint_hash,
                          before_map=self.before_map)


def resolve_backend(name: str) -> str:
    """auto -> cuda when cupy sees a device, else numpy; other names unchanged."""
    if name != "auto":
        return name
    try:
        import cupy

        return "cuda" if cupy.cuda.is_available() else "numpy"
    except Exception:  # noqa: BLE001 - no cupy, no driver: the CPU
        return "numpy"


def handshake_done() -> bool:
    return _STATE["handshake_done"]


def _exchange(mpi_comm: Any, payload: str) -> tuple[str | None, str, float]:
    """All-gather (payload, rank 0's token); returns (refusal line or None, token, ms)."""
    t0 = time.perf_counter()
    token = new_token() if mpi_comm.Get_rank() == 0 else None
    gathered = mpi_comm.allgather((payload, token))
    line = fpmod.decide([p for p, _ in gathered])
    _STATE["handshake_done"] = True
    return line, gathered[0][1], (time.perf_counter() - t0) * 1e3


def join_handshake_with_error(error: SettingsError) -> str:
    """For a rank whose settings failed before start(): take part in the handshake with the error; the line."""
    from mpi4py import MPI

    line, _, _ = _exchange(MPI.COMM_WORLD, fpmod.payload_error(str(error)))
    return line or error.line


def start(settings: Settings, *, backend: str | None = None,
          before_map: Callable[[int, str], None] | None = None) -> World:
    """The world this process runs in; raises SettingsError (agreed by all ranks) on a fingerprint refusal.

    `backend` is the resolved backend when the caller knows it; else settings.backend, auto resolved here.
    `before_map` observes this world's shared segments (World.shared_segment).
    """
    launched = env.launcher_world()
    resolved = backend or resolve_backend(settings.backend)
    if launched is None:
        settings = _with_model_id(settings)
        fp = fpmod.fingerprint(settings, backend=resolved)
        _STATE["handshake_done"] = True
        local = LocalComm()
        return World(0, 1, 0, 1, local, settings, resolved, new_token(), fp, fpmod.fingerprint_hash(fp), 0.0,
                     host_comm=local, before_map=before_map)

    from mpi4py import MPI

    world = MPI.COMM_WORLD
    try:
        settings = _with_model_id(settings)
        fp = fpmod.fingerprint(settings, backend=resolved)
        payload = fpmod.payload_ok(fp)
    except SettingsError as e:
        fp = {}
        payload = fpmod.payload_error(str(e))
    line, token, ms = _exchange(world, payload)
    if line is not None:
        raise SettingsError(line, agreed=True)
    local = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.Get_rank())
    mpich_shm.release(local.Get_rank())        # every local rank is past MPI_Init: a kill now leaves nothing
    host = MpiComm(world)
    comm: Comm = host if world.Get_size() > 1 else LocalComm()
    device = 0
    if resolved == "cuda":
        from cupyglm.distributed.devices import DeviceError, pick_device

        try:
            device, error = pick_device(local.Get_rank(), local.Get_size(), local), None
        except DeviceError as e:
            error = f"rank {world.Get_rank()}: {e}"
        errors = [e for e in world.allgather(error) if e]          # refused together, before NCCL starts
        if errors:
            raise SettingsError(f"REFUSE devices: {errors[0]}", agreed=True)
        if world.Get_size() > 1:
            from cupyglm.distributed.comm import NcclComm

            comm = NcclComm(world, device)
        else:
            import cupy

            cupy.cuda.Device(device).use()
    return World(world.Get_rank(), world.Get_size(), local.Get_rank(), local.Get_size(), comm, settings, resolved,
                 token, fp, fpmod.fingerprint_hash(fp), ms, mpi=world, local_mpi=local, host_comm=host, device=device,
                 before_map=before_map)


def _with_model_id(settings: Settings) -> Settings:
    if settings.model_id is not None:
        return settings
    return dataclasses.replace(settings, model_id=fpmod.model_identity(settings.model))
