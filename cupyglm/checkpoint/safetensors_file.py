"""Safetensors files: parsed (8-byte little-endian header length, JSON header, raw bytes) and memory-mapped; each
tensor is an `np.frombuffer` view over the map (bf16 as `ml_dtypes.bfloat16`), and its mapped pages can be
released once a rank has copied its slice out. Every error names the file and tensor it is about
(CheckpointError, a ValueError). Also the writer (the tiny checkpoint, bench models).
"""
from __future__ import annotations

import json
import mmap
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

class CheckpointError(ValueError):
    pass


if sys.byteorder != "little":       # safetensors is little-endian; views over the map assume the host is too
    raise ImportError("cupyglm.checkpoint.safetensors_file needs a little-endian host")


DTYPES: dict[str, np.dtype] = {
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F16": np.dtype(np.float16),
    "F32": np.dtype(np.float32),
    "F64": np.dtype(np.float64),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),      # FP8 weights and NVFP4 scales (checkpoint/quant.py)
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "I16": np.dtype(np.int16),
    "I32": np.dtype(np.int32),
    "I64": np.dtype(np.int64),
    "BOOL": np.dtype(np.bool_),
}
DTYPE_NAMES: dict[np.dtype, str] = {v: k for k, v in DTYPES.items()}

MAX_HEADER_BYTES = 100 * 1024 * 1024
# A read fault maps the cached pages of its whole aligned 64 KiB block (Linux's default fault-around), so a
# release drops whole blocks: the neighbours' pages it also drops fault back in when they are read.
FAULT_AROUND = max(64 * 1024, mmap.PAGESIZE)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int          # absolute byte offsets in the file
    end: int


class SafetensorsFile:
    """One memory-mapped safetensors file. `get(name)` is a zero-copy read-only view."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            fh = open(self.path, "rb")
        except FileNotFoundError:
            raise CheckpointError(f"{self.path}: safetensors file not found") from None
        with fh:
            size = os.fstat(fh.fileno()).st_size
            if size < 8:
                raise CheckpointError(f"{self.path}: truncated safetensors file ({size} bytes, no header length)")
            n = int.from_bytes(fh.read(8), "little")
            if n < 2 or n > MAX_HEADER_BYTES or 8 + n > size:
                raise CheckpointError(f"{self.path}: bad safetensors header length {n} (file is {size} bytes)")
            try:
                header = json.loads(fh.read(n).decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise CheckpointError(f"{self.path}: safetensors header is not valid JSON ({e})") from None
            if not isinstance(header, dict):
                raise CheckpointError(f"{self.path}: safetensors header is not a JSON object")
            self.metadata = header.pop("__metadata__", None) or {}
            base = 8 + n
            self.tensors: dict[str, TensorInfo] = {}
            for name, entry in header.items():
                self.tensors[name] = self._entry(name, entry, base, size)
            self._mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size > base else None
        self.size = size

    def _entry(self, name: str, entry, base: int, size: int) -> TensorInfo:
        where = f"{self.path}: tensor {name!r}"
        if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= entry.keys():
            raise CheckpointError(f"{where}: header entry needs dtype, shape and data_offsets")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if dtype not in DTYPES:
            raise CheckpointError(f"{where}: unsupported dtype {dtype!r}")
        if (not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape)
                or not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) and o >= 0 for o in offsets) or offsets[0] > offsets[1]):
            raise CheckpointError(f"{where}: malformed shape {shape!r} or data_offsets {offsets!r}")
        start, end = base + offsets[0], base + offsets[1]
        if end > size:
            raise CheckpointError(f"{where}: data_offsets {offsets} run past the end of the file "
                                  f"({size - base} data bytes); the file is truncated or corrupt")
        want = int(np.prod(shape, dtype=np.int64)) * DTYPES[dtype].itemsize
        if end - start != want:
            raise CheckpointError(f"{where}: data_offsets span {end - start} bytes, shape {tuple(shape)} "
                                  f"of {dtype} needs {want}")
        return TensorInfo(name, dtype, tuple(shape), start, end)

    def keys(self) -> list[str]:
        return list(self.tensors)

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def get(self, name: str) -> np.ndarray:
        info = self.tensors.get(name)
        if info is None:
            raise CheckpointError(f"{self.path}: no tensor {name!r}")
        dtype = DTYPES[info.dtype]
        count = (info.end - info.start) // dtype.itemsize
        if count == 0:
            return np.zeros(info.shape, dtype)
        arr = np.frombuffer(self._mm, dtype=dtype, count=count, offset=info.start)
        return arr.reshape(info.shape)

    def release(self, name: str) -> None:
        """Drop the mapped pages under `name` from this process (they stay in the page cache; a later read
        faults them back), so a tensor already copied out no longer counts in the host's resident set."""
        info = self.tensors.get(name)
        if info is None or self._mm is None or info.end == info.start or not hasattr(mmap, "MADV_DONTNEED"):
            return
        start = info.start - info.start % FAULT_AROUND
        end = min(len(self._mm), -(-info.end // FAULT_AROUND) * FAULT_AROUND)
        self._mm.madvise(mmap.MADV_DONTNEED, start, end - start)


def write_safetensors(path: str | Path, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> int:
    """Write `tensors` as a safetensors file (sorted by name, header padded to 8 bytes). Returns bytes written.

    Byte-for-byte deterministic for equal inputs; accepts ml_dtypes.bfloat16 arrays."""
    header: dict = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    order = sorted(tensors)
    blobs = []
    for name in order:
        arr = np.ascontiguousarray(tensors[name]).reshape(np.shape(tensors[name]))   # keeps 0-d scalars 0-d
        dtype = DTYPE_NAMES.get(arr.dtype)
        if dtype is None:
            raise ValueError(f"{name}: dtype {arr.dtype} cannot be stored in safetensors")
        data = arr.tobytes()        # little-endian hosts only (checked at import)
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    tmp = Path(str(path) + ".part")
    with open(tmp, "wb") as fh:
        fh.write(len(raw).to_bytes(8, "little"))
        fh.write(raw)
        for b in blobs:
            fh.write(b)
    os.replace(tmp, path)
    return 8 + len(raw) + offset
