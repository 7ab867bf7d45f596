"""Random weights memoized on disk: each tensor of a random model generated once (keyed by the config, the seed
and the quantisation format) and read back memory-mapped by every later run or step.

Unquantised tensors are the tiny generator's values (checkpoint/tiny.py init_tensor) in their stored dtype,
shared by every format of the same (config, seed). Quantised projections are generated directly in the
stored form -- random packed codes and scales, never a bf16 tensor quantised in numpy:
  nvfp4: values uint8 [N, K/2] (two e2m1 codes a byte, every code valid), scale uint8 e4m3 codes [N, K/16]
         in [0.5, 1.5], scale2 float32 [1] chosen so the weight's RMS is the init rule's std;
  fp8:   values uint8 e4m3 codes [N, K] of N(0, 1) draws, scale float32 [ceil(N/bn), ceil(K/bk)] = std.
Layout on disk: <cache>/random/<key>/<name>.npy, a quantised one as <name>.<fmt>.{values,scale,scale2}.npy.
"""
from __future__ import annotations

import hashlib
import math
import os
import tempfile
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import ml_dtypes
import numpy as np

from cupyglm import env
from cupyglm.backend.qweight import QWeight
from cupyglm.checkpoint import names, quant as qformat
from cupyglm.checkpoint.tiny import DTYPES, DENSE_DOWN, DENSE_MLP_GAIN, DENSE_UP, _rng, init_tensor
from cupyglm.config import ModelConfig

FORMAT = 1                                   # bump when the generated values change
E2M1_RMS = math.sqrt(68.5 / 8)               # RMS of a uniformly random e2m1 code (|v| in 0, .5, 1, 1.5, 2, 3, 4, 6)
SCALE_RMS = math.sqrt(13 / 12)               # RMS of U(0.5, 1.5)


def store_dir(cfg: ModelConfig, seed: int) -> Path:
    key = hashlib.sha256(f"{FORMAT}-{cfg.identity()}-{seed}".encode()).hexdigest()[:16]
    return env.cache_dir() / "random" / key


def _std(spec: names.TensorSpec) -> float:
    """The init rule's std of a quantisable projection [N, K] (checkpoint/tiny.py init_tensor)."""
    k = spec.shape[-1]
    if DENSE_UP.search(spec.name):
        return DENSE_MLP_GAIN / math.sqrt(k)
    if DENSE_DOWN.search(spec.name):
        return 1.0 / (DENSE_MLP_GAIN ** 2 * math.sqrt(k))
    return 1.0 / math.sqrt(k)


def random_qweight(spec: names.TensorSpec, scheme: qformat.QuantScheme, seed: int) -> dict[str, np.ndarray]:
    """One quantised projection's stored arrays, drawn directly (see the module docstring)."""
    n, k = spec.shape
    rng = _rng(seed, spec.name + "." + scheme.fmt)
    std = _std(spec)
    if scheme.fmt == qformat.NVFP4:
        g = qformat.NVFP4_GROUP
        scale = rng.uniform(0.5, 1.5, size=(n, k // g)).astype(np.float32).astype(ml_dtypes.float8_e4m3fn)
        return {"values": rng.integers(0, 256, size=(n, k // 2), dtype=np.uint8), "scale": scale.view(np.uint8),
                "scale2": np.array([std / (E2M1_RMS * SCALE_RMS)], np.float32)}
    bn, bk = scheme.block
    codes = rng.standard_normal((n, k), dtype=np.float32).astype(ml_dtypes.float8_e4m3fn)
    return {"values": codes.view(np.uint8), "scale": np.full((-(-n // bn), -(-k // bk)), std, np.float32)}


def _save(path: Path, a: np.ndarray) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        a = np.ascontiguousarray(a)
        with os.fdopen(fd, "wb") as f:               # ml_dtypes' types (bf16, e4m3) as their bit patterns
            np.save(f, a.view(f"u{a.dtype.itemsize}") if a.dtype.kind == "V" else a)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class RandomStore(Mapping):
    """name -> tensor (a QWeight for a quantised projection), generated on first use and memoized on disk."""

    def __init__(self, cfg: ModelConfig, seed: int, scheme=None, quantised=frozenset()):
        self.cfg, self.seed, self.scheme, self.quantised = cfg, seed, scheme, quantised
        self.specs = {s.name: s for s in names.all_specs(cfg)}
        self.dir = store_dir(cfg, seed)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.generated = 0                   # tensors this store generated (the rest were read back)

    def _paths(self, name: str) -> dict[str, Path]:
        if name in self.quantised:
            parts = ("values", "scale", "scale2") if self.scheme.fmt == qformat.NVFP4 else ("values", "scale")
            return {p: self.dir / f"{name}.{self.scheme.fmt}.{p}.npy" for p in parts}
        return {"x": self.dir / f"{name}.npy"}

    def build(self, name: str) -> None:
        """Generate and store one tensor unless it is already on disk."""
        paths = self._paths(name)
        if all(p.is_file() for p in paths.values()):
            return
        spec = self.specs[name]
        arrays = random_qweight(spec, self.scheme, self.seed) if name in self.quantised else \
            {"x": init_tensor(spec, self.cfg, self.seed)}
        for part, p in paths.items():
            _save(p, arrays[part])
        self.generated += 1

    def build_all(self, threads: int | None = None) -> None:
        """Every text tensor on disk, generated in parallel threads (numpy's generators release the GIL)."""
        todo = [n for n, s in self.specs.items() if s.part == "text"]
        with ThreadPoolExecutor(threads or os.cpu_count() or 1) as pool:
            list(pool.map(self.build, todo))

    def __getitem__(self, name: str):
        self.build(name)
        loaded = {part: np.load(p, mmap_mode="r") for part, p in self._paths(name).items()}
        if name not in self.quantised:
            return loaded["x"].view(DTYPES[self.specs[name].dtype])
        spec = self.specs[name]
        if self.scheme.fmt == qformat.NVFP4:
            return QWeight(qformat.NVFP4, spec.shape, loaded["values"], loaded["scale"], loaded["scale2"])
        return QWeight(qformat.FP8, spec.shape, loaded["values"], loaded["scale"], None, self.scheme.block)

    def __iter__(self):
        return iter(self.specs)

    def __len__(self) -> int:
        return len(self.specs)
