"""Which GPU a rank uses: its index among the devices it can see, agreed over the ranks of its host.

The runtime's device count already honours CUDA_VISIBLE_DEVICES (so no environment is read here). Cases:
* the host's ranks see at least local_size devices: rank i of the host uses device i (mpirun on one node);
* each rank sees exactly one device (e.g. `srun --gpus-per-task=1`): device 0, provided the ranks' devices
  differ (PCI addresses gathered over the host's ranks); two ranks on one GPU are refused;
* more ranks on the host than devices visible: refused, naming both counts.
"""
from __future__ import annotations

from typing import Any


class DeviceError(RuntimeError):
    """This rank has no GPU of its own; the message says why and what to launch instead."""


def _pci(cupy, index: int) -> str:
    p = cupy.cuda.runtime.getDeviceProperties(index)
    return f"{p.get('pciDomainID', 0):04x}:{p.get('pciBusID', 0):02x}:{p.get('pciDeviceID', 0):02x}"


def pick_device(local_rank: int, local_size: int, local_mpi: Any = None) -> int:
    """The device index of this rank (collective over local_mpi, the host's ranks, when it is given)."""
    import cupy

    visible = int(cupy.cuda.runtime.getDeviceCount())
    if visible < 1:
        raise DeviceError(f"local rank {local_rank}: no visible CUDA device")
    if local_size <= visible:
        return local_rank
    if visible > 1:
        raise DeviceError(f"{local_size} ranks on this host but local rank {local_rank} sees only {visible} GPUs "
                          f"(CUDA_VISIBLE_DEVICES): launch at most {visible} ranks a host, or give each rank one GPU")
    mine = _pci(cupy, 0)
    seen = local_mpi.allgather(mine) if local_mpi is not None else [mine]
    shared = sorted({p for p in seen if seen.count(p) > 1})        # the same list on every rank of the host
    if shared:
        twins = [r for r, p in enumerate(seen) if p == shared[0]]
        raise DeviceError(f"local ranks {twins} all see only the GPU at PCI {shared[0]}: {local_size} ranks on this "
                          "host need a GPU each (one visible GPU per rank, e.g. srun --gpus-per-task=1)")
    return 0
