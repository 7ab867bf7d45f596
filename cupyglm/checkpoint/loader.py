"""Checkpoint: a Hugging Face directory (config.json, safetensors, tokenizer) checked against the split table in
`cupyglm.checkpoint.names` and read by each rank one tensor slice at a time.

Safetensors files are parsed and memory-mapped by `cupyglm.checkpoint.safetensors_file`. Opening reads headers
only: every stored tensor must be in the table and every table tensor stored with its shape and dtype.
A rank's weights are read through `read_shard` (its slice copied out, the mapped pages released), so no rank
ever holds the unsplit tensor set in host memory. Every error names the file and tensor it is about
(CheckpointError, a ValueError).
"""
from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from cupyglm.checkpoint import names, quant
from cupyglm.checkpoint.safetensors_file import (  # noqa: F401  (re-exported: the loader's public names)
    DTYPE_NAMES, DTYPES, FAULT_AROUND, MAX_HEADER_BYTES, CheckpointError, SafetensorsFile, TensorInfo,
    write_safetensors)
from cupyglm.config import ConfigError, ModelConfig

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


class Checkpoint:
    """An opened checkpoint directory: headers parsed and checked against the split table, data left mapped.

    `read_shard` reads one tensor's rank slice at a time; `shard` is the lazy name -> slice view the model's
    weight construction reads through, so no rank ever holds the unsplit tensor set in host memory."""

    def __init__(self, path: Path, config: ModelConfig, tokenizer, files: dict[str, SafetensorsFile],
                 weight_map: dict[str, str], identity: str, scheme: quant.QuantScheme | None = None):
        self.path = path
        self.config = config
        self.tokenizer = tokenizer
        self.files = files
        self.weight_map = weight_map
        self.identity = identity
        self.specs = {s.name: s for s in names.all_specs(config)}            # what the text model loads
        self.table = {s.name: s for s in names.checkpoint_specs(config)}     # every stored tensor
        self.scheme = scheme                  # the declared quantisation (None: bf16)
        self.quantised: set[str] = set()      # the projections stored quantised (read as QWeight)

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
        try:
            scheme = quant.read_scheme(path, json.loads(cfg_bytes))     # refused by name before any weight
        except quant.QuantError as e:
            raise CheckpointError(str(e)) from None

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

        ckpt = cls(path, config, tokenizer, files, dict(weight_map), identity, scheme)
        ckpt._resolve_quant(path / where)
        ckpt._check_layout(path / where)
        return ckpt

    def _resolve_quant(self, where: Path) -> None:
        """Which projections the checkpoint stores quantised; their companions join the table."""
        stored = {n: info.dtype for f in self.files.values() for n, info in f.tensors.items()}
        try:
            self.quantised, self.table = quant.resolve(self.scheme, self.table, stored, str(where))
        except quant.QuantError as e:
            raise CheckpointError(str(e)) from None

    def check_tp(self, tp: int) -> None:
        """Refuse a TP size that would cut a quantised projection's scale blocks (names the tensor)."""
        try:
            [quant.check_tp(self.specs[name], self.scheme, tp) for name in sorted(self.quantised)]
        except quant.QuantError as e:
            raise CheckpointError(f"{self.path}: {e}") from None

    def read_weight(self, name: str, rank: int, tp: int):
        """This rank's slice of one text-model tensor: an array, or a QWeight (packed values and scales as
        stored) for a quantised projection."""
        if name in self.quantised:
            return quant.read_qweight(lambda n: self.read_shard(n, rank, tp), self.specs[name], self.scheme, tp)
        return self.read_shard(name, rank, tp)

    def _stored_specs(self, name: str) -> list:
        return quant.companions(self.specs[name], self.scheme) if name in self.quantised else [self.table[name]]

    def _check_layout(self, where: Path) -> None:
        """Every stored tensor is in the table, and every table tensor is stored with its shape and dtype."""
        stored = set(self.weight_map)
        for fname, f in self.files.items():
            stored.update(f.keys())
        unknown = sorted(stored - self.table.keys())
        if unknown:
            first = unknown[0]
            hint = ""
            moved = names.TEXT_PREFIX + first.removeprefix("model.")
            if first.startswith("model.") and moved in self.table:
                hint = f"; the text model's tensors are under {names.TEXT_PREFIX!r} (e.g. {moved!r})"
            raise CheckpointError(f"{where}: unknown tensor {first!r}, not in the GLM-5.3-Flash table "
                                  f"({len(unknown)} unknown in all){hint}")
        for spec in self.table.values():
            fname = self.weight_map.get(spec.name)
            if fname is None:
                raise CheckpointError(f"{where}: missing tensor {spec.name!r} (not in the weight map)")
            info = self.files[fname].tensors.get(spec.name)
            if info is None:
                raise CheckpointError(f"{self.path / fname}: missing tensor {spec.name!r} "
                                      f"({where.name} says it is in {fname})")
            if info.shape != spec.shape:
                raise CheckpointError(f"{self.path / fname}: tensor {spec.name!r} has shape {info.shape}, "
                                      f"expected {spec.shape}")
            if info.dtype != spec.dtype:
                raise CheckpointError(f"{self.path / fname}: tensor {spec.name!r} is stored as {info.dtype}, "
                                      f"expected {spec.dtype}")

    # -- access --
    def names(self) -> list[str]:
        """Every tensor the text model reads, in split-table order."""
        return list(self.specs)

    def tensor(self, name: str) -> np.ndarray:
        """The full tensor (zero-copy, read-only view over the map)."""
        fname = self.weight_map.get(name)
        if fname is None:
            raise CheckpointError(f"{self.path}: no tensor {name!r}")
        return self.files[fname].get(name)

    def read_shard(self, name: str, rank: int, tp: int) -> np.ndarray:
        """This rank's slice of one tensor by the split table (rep whole, row/col a contiguous block of dim
        0/1) as an owned C-contiguous array in the stored dtype. Only the slice's bytes are read, and the
        mapped pages it touched are released, so the host keeps nothing of the tensor but the returned array."""
        _check_rank(rank, tp)
        spec = self.table.get(name)
        if spec is None:
            raise CheckpointError(f"{self.path}: no tensor {name!r} in the table")
        full = self.tensor(name)
        if spec.split == "rep" or tp == 1:
            part = full
        else:
            shape = spec.shard_shape(tp)        # raises ValueError naming the tensor when it does not divide
            if spec.split == "row":
                part = full[rank * shape[0]:(rank + 1) * shape[0]]
            elif spec.split == "col":
                part = full[:, rank * shape[1]:(rank + 1) * shape[1]]
            else:
                raise ValueError(f"{spec.name}: unknown split kind {spec.split!r}")
        out = np.array(part, order="C")
        self.files[self.weight_map[name]].release(name)
        return out

    def shard(self, rank: int, tp: int) -> "Shard":
        """The lazy view of this rank's slices of every tensor the text model loads (read on access)."""
        self.check_tp(tp)
        return Shard(self, rank, tp)

    def nbytes(self) -> int:
        """Bytes of the tensors the text model reads (full, unsharded, as stored)."""
        return sum(self._stored(s.name).end - self._stored(s.name).start
                   for name in self.specs for s in self._stored_specs(name))

    def shard_nbytes(self, rank: int, tp: int) -> int:
        """Bytes of this rank's slices of the tensors the text model reads, in the stored dtypes."""
        _check_rank(rank, tp)
        self.check_tp(tp)
        return sum(math.prod(s.shard_shape(tp)) * DTYPES[s.dtype].itemsize
                   for name in self.specs for s in self._stored_specs(name))

    def _stored(self, name: str) -> TensorInfo:
        return self.files[self.weight_map[name]].tensors[name]

    def __repr__(self) -> str:
        return f"Checkpoint({str(self.path)!r}, identity={self.identity})"


class Shard(Mapping):
    """name -> this rank's slice (Checkpoint.read_shard), read when asked for: one tensor in flight at a time."""

    def __init__(self, ckpt: Checkpoint, rank: int, tp: int):
        _check_rank(rank, tp)
        self.ckpt, self.rank, self.tp = ckpt, rank, tp

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.ckpt.specs:
            raise KeyError(name)
        return self.ckpt.read_weight(name, self.rank, self.tp)

    def __iter__(self):
        return iter(self.ckpt.specs)

    def __len__(self) -> int:
        return len(self.ckpt.specs)


def _check_rank(rank: int, tp: int) -> None:
    if tp < 1 or not 0 <= rank < tp:
        raise ValueError(f"rank {rank} is outside tp={tp}")


def open_model(model: str | Path | None) -> Checkpoint:
    """Open `model` (a checkpoint directory); None opens the built-in tiny checkpoint (built once, cached)."""
    if model is None:
        from cupyglm.checkpoint.tiny import default_tiny_dir

        return Checkpoint.open(default_tiny_dir())
    return Checkpoint.open(Path(model).expanduser())
