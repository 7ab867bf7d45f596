"""KV rows in host memory (CUPYGLM_KV_HOST=1): every KV layer's latent rows on host pages, and the gather
that brings a call's picked rows into device slots (op kv_gather, cuda_src/gather.cu).

cuda: the host rows are pinned host memory mapped into the device (`cudaHostAlloc` with
`cudaHostAllocMapped`), used through their device pointer, so the KV write, the gather and the kept-state copies
reach them like device memory; the flag words are mapped the same way, so the host reads them after the step's
synchronize without a copy. CPU backends: a separate host allocation through the same code.

What bounds a gather's distinct rows (checked: a gather past its slots raises its flag word, and the engine
refuses the request by name after the step): a gather covers one call segment, i.e. one sequence's rows
start..start+n-1; every id it lists is a position below start + n, one host row each, so it needs at most
start + n <= the window (`context`) slots, and the plan sizes the slots to the window. A test-only knob
(CUPYGLM_KV_HOST_SLOTS) makes the slots fewer.
"""
from __future__ import annotations

import ctypes

import numpy as np

from cupyglm.config import ModelConfig
from cupyglm.memory import ArraySpec, gather_arrays, host_latent_arrays, storage_of

FLAG_WORDS = 1024                      # segments one call may hold (a flag word each)
CUDA_HOST_ALLOC_MAPPED = 2             # cudaHostAllocMapped
_NAN_BITS = 0x7FC0                     # bf16 quiet NaN as stored on cuda


def slots_message(slots: int) -> str:
    return f"kv host: a call picked more distinct rows than the gather's {slots} slots"


class KVHostSlots(RuntimeError):
    """A call segment needed more distinct rows than the gather has slots."""


class _Pinned:
    """Pinned host memory mapped into the device: `nbytes` at host pointer `host`, device pointer `device`."""

    def __init__(self, nbytes: int):
        import cupy

        self._runtime = cupy.cuda.runtime
        self.host = int(self._runtime.hostAlloc(max(1, nbytes), CUDA_HOST_ALLOC_MAPPED))
        self.device = int(self._runtime.pointerGetAttributes(self.host).devicePointer)

    def __del__(self):
        try:
            if self.host:
                self._runtime.freeHost(self.host)
                self.host = 0
        except Exception:               # interpreter shutdown: the driver may be gone already
            pass


def _mapped(shape, dtype, fill):
    """(a cupy array over mapped pinned host memory, a numpy view of the same bytes)."""
    import cupy

    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    pin = _Pinned(nbytes)
    host = np.ctypeslib.as_array((ctypes.c_uint8 * max(1, nbytes)).from_address(pin.host))[:nbytes]
    host = host.view(dtype).reshape(shape)
    host[...] = fill
    mem = cupy.cuda.UnownedMemory(pin.device, max(1, nbytes), pin)
    return cupy.ndarray(shape, dtype, memptr=cupy.cuda.MemoryPointer(mem, 0)), host


class HostRows:
    """One rank's host latent rows (per KV layer [rows, R] bf16), the gather's device buffers and flag words."""

    def __init__(self, cfg: ModelConfig, ops, rows: int, slots: int, poison: bool = False):
        if slots < 1:
            raise ValueError(f"kv host: the gather needs at least one slot, got {slots}")
        self.ops, self.rows, self.num_slots = ops, rows, slots
        xp, storage = ops.xp, storage_of(ops)
        cpu = xp is np
        self.latent = {}
        for spec in host_latent_arrays(cfg, 1, rows):           # kv.latent.<layer>: [rows, R] bf16, host memory
            self.latent[int(spec.name.rsplit(".", 1)[1])] = self._host(spec, storage, poison, cpu)
        slots_spec, _, _ = gather_arrays(cfg, rows, slots)
        dtype = storage.dtype(slots_spec.kind)
        self.slots = xp.zeros(slots_spec.shape, dtype=dtype)     # [slots, R] bf16, device
        self.slot_row = xp.full((slots,), -1, dtype=np.int32)    # [slots] i32, device
        self.marks = xp.full((rows,), -1, dtype=np.int32)        # [rows] i32, -1 between calls, device
        if cpu:
            self.flags = np.zeros((FLAG_WORDS,), dtype=np.int32)    # [F] i32 a word per call segment
            self._flags_host = self.flags
        else:
            self.flags, self._flags_host = _mapped((FLAG_WORDS,), np.int32, 0)

    @staticmethod
    def _host(spec: ArraySpec, storage, poison: bool, cpu: bool):
        dtype = storage.dtype(spec.kind)
        if cpu:
            return np.full(spec.shape, np.nan, dtype=dtype) if poison else np.zeros(spec.shape, dtype=dtype)
        fill = (_NAN_BITS if dtype.kind in "iu" else np.nan) if poison else 0
        dev, _ = _mapped(spec.shape, dtype, fill)
        return dev

    @property
    def message(self) -> str:
        return slots_message(self.num_slots)

    def gather(self, layer: int, rows, counts, which: int):
        """Slot ids [T, W] int32 for one segment's store rows [T, W] (-1 padded); the slots hold the rows."""
        if which >= FLAG_WORDS:
            raise ValueError(f"kv host: a call of more than {FLAG_WORDS} sequences")
        return self.ops.kv_gather(self.latent[layer], rows, counts, self.marks, self.slot_row, self.slots,
                                  self.flags, which)

    def take_refused(self) -> list[int]:
        """After the step's synchronize: the call segments that ran out of slots (their flag words cleared)."""
        xp = self.ops.xp
        if xp is not np:
            xp.cuda.get_current_stream().synchronize()            # a no-op after the step's read-back
        hit = np.flatnonzero(self._flags_host)
        if hit.size:
            self._flags_host[hit] = 0
        return [int(i) for i in hit]
