"""Checkpoint: a Hugging Face directory (config.json, safetensors, tokenizer) opened zero-copy, sharded by
the split table in `cupyglm.checkpoint.names`.

Safetensors files are parsed here (8-byte little-endian header length, JSON header, raw bytes) and
memory-mapped; each tensor is an `np.frombuffer` view over the map (bf16 as `ml_dtypes.bfloat16`).
Every error names the file it is about (CheckpointError, a ValueError).
"""
from __future__ import annotations

import hashlib
import json
import mmap
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

from cupyglm.checkpoint import names
from cupyglm.config import ConfigError, ModelConfig


class CheckpointError(ValueError):
    pass


if sys.byteorder != "little":       # safetensors is little-endian; views over the map assume the host is too
    raise ImportError("cupyglm.checkpoint.loader needs a little-endian host")


DTYPES: dict[str, np.dtype] = {
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F16": np.dtype(np.float16),
    "F32": np.dtype(np.float32),
    "F64": np.dtype(np.float64),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "I16": np.dtype(np.int16),
    "I32": np.dtype(np.int32),
    "I64": np.dtype(np.int64),
    "BOOL": np.dtype(np.bool_),
}
DTYPE_NAMES: dict[np.dtype, str] = {v: k for k, v in DTYPES.items()}

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
MAX_HEADER_BYTES = 100 * 1024 * 1024


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
        arr = np.ascontiguousarray(tensors[name])
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


class Checkpoint:
    """An opened checkpoint directory. Tensors are zero-copy views over memory-mapped files."""

    def __init__(self, path: Path, config: ModelConfig, tokenizer, files: dict[str, SafetensorsFile],
                 weight_map: dict[str, str], identity: str):
        self.path = path
        self.config = config
        self.tokenizer = tokenizer
        self.files = files
        self.weight_map = weight_map
        self.identity = identity
        self.specs = {s.name: s for s in names.all_specs(config)}

    @classmethod
    def open(cls, path: str | Path) -> "Checkpoint":
        from cupyglm.checkpoint.tokenizer import Tokenizer

        path = Path(path)
        if not path.is_dir():
            raise CheckpointError(f"{path}: checkpoint directory not found")
        cfg_file = path / "config.json"
        if not cfg_file.is_file():
            raise CheckpointError(f"{cfg_file}: missing config.json")
        cfg_bytes = cfg_file.read_bytes()
        try:
            config = ModelConfig.from_file(cfg_file)
        except ConfigError as e:
            raise CheckpointError(f"{cfg_file}: {e}") from None
        identity = hashlib.sha256(cfg_bytes).hexdigest()[:16]

        tok_file = path / "tokenizer.json"
        if not tok_file.is_file():
            raise CheckpointError(f"{tok_file}: missing tokenizer.json")
        try:
            tokenizer = Tokenizer.from_dir(path)
        except (OSError, ValueError) as e:
            raise CheckpointError(str(e)) from None

        index_file = path / INDEX_FILE
        files: dict[str, SafetensorsFile] = {}
        if index_file.is_file():
            try:
                index = json.loads(index_file.read_text())
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise CheckpointError(f"{index_file}: not valid JSON ({e})") from None
            weight_map = index.get("weight_map") if isinstance(index, dict) else None
            if not isinstance(weight_map, dict):
                raise CheckpointError(f"{index_file}: no weight_map object")
            for fname in sorted(set(weight_map.values())):
                fpath = path / fname
                if not fpath.is_file():
                    raise CheckpointError(f"{fpath}: shard file named in {INDEX_FILE} is missing")
                files[fname] = SafetensorsFile(fpath)
            where = INDEX_FILE
        elif (path / SINGLE_FILE).is_file():
            files[SINGLE_FILE] = SafetensorsFile(path / SINGLE_FILE)
            weight_map = {n: SINGLE_FILE for n in files[SINGLE_FILE].keys()}
            where = SINGLE_FILE
        else:
            raise CheckpointError(f"{path}: no {INDEX_FILE} and no {SINGLE_FILE}")

        ckpt = cls(path, config, tokenizer, files, dict(weight_map), identity)
        for spec in ckpt.specs.values():
            fname = weight_map.get(spec.name)
            if fname is None:
                raise CheckpointError(f"{path / where}: missing tensor {spec.name!r} (not in the weight map)")
            info = files[fname].tensors.get(spec.name)
            if info is None:
                raise CheckpointError(f"{path / fname}: missing tensor {spec.name!r} "
                                      f"({where} says it is in {fname})")
            if info.shape != spec.shape:
                raise CheckpointError(f"{path / fname}: tensor {spec.name!r} has shape {info.shape}, "
                                      f"expected {spec.shape}")
        return ckpt

    # -- access --
    def names(self) -> list[str]:
        """Every tensor the model reads, in split-table order."""
        return list(self.specs)

    def tensor(self, name: str) -> np.ndarray:
        """The full tensor (zero-copy, read-only)."""
        fname = self.weight_map.get(name)
        if fname is None:
            raise CheckpointError(f"{self.path}: no tensor {name!r}")
        return self.files[fname].get(name)

    def shard(self, rank: int, tp: int) -> dict[str, np.ndarray]:
        """This rank's slice of every tensor by the split table: rep whole, row/col a contiguous block of
        dim 0/1. Row and rep slices are zero-copy views; col slices are C-contiguous copies (tp > 1)."""
        if tp < 1 or not 0 <= rank < tp:
            raise ValueError(f"rank {rank} is outside tp={tp}")
        out: dict[str, np.ndarray] = {}
        for spec in self.specs.values():
            full = self.tensor(spec.name)
            if spec.split == "rep" or tp == 1:
                out[spec.name] = full
                continue
            shape = spec.shard_shape(tp)        # raises ValueError naming the tensor when it does not divide
            if spec.split == "row":
                n = shape[0]
                out[spec.name] = full[rank * n:(rank + 1) * n]
            elif spec.split == "col":
                n = shape[1]
                out[spec.name] = np.ascontiguousarray(full[:, rank * n:(rank + 1) * n])
            else:
                raise ValueError(f"{spec.name}: unknown split kind {spec.split!r}")
        return out

    def nbytes(self) -> int:
        """Bytes of the tensors the model reads (full, unsharded)."""
        total = 0
        for name in self.specs:
            info = self.files[self.weight_map[name]].tensors[name]
            total += info.end - info.start
        return total

    def __repr__(self) -> str:
        return f"Checkpoint({str(self.path)!r}, identity={self.identity})"


def open_model(model: str | Path | None) -> Checkpoint:
    """Open `model` (a checkpoint directory); None opens the built-in tiny checkpoint (built once, cached)."""
    if model is None:
        from cupyglm.checkpoint.tiny import default_tiny_dir

        return Checkpoint.open(default_tiny_dir())
    return Checkpoint.open(Path(model).expanduser())
