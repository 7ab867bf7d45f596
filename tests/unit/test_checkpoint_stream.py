"""Loading streams: a rank reads each tensor's slice alone (read_shard), as an owned array in the stored dtype,
and the mapped pages it touched leave the process's resident set; the model reads every text tensor once."""
from __future__ import annotations

import math
from pathlib import Path

import ml_dtypes
import numpy as np

from cupyglm.checkpoint import names
from cupyglm.checkpoint.loader import DTYPES, Checkpoint

BF16 = np.dtype(ml_dtypes.bfloat16)
TEXT = names.TEXT_PREFIX


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint16)


def _rss_file_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1])
    raise RuntimeError("no RssFile in /proc/self/status")


def test_read_shard_owns_its_slice(tiny_ckpt):
    """A slice is the rank's bytes only, copied out of the map (nothing keeps the full tensor alive)."""
    s = tiny_ckpt.read_shard("lm_head.weight", 1, 2)
    full = tiny_ckpt.tensor("lm_head.weight")
    assert s.flags.owndata and s.flags.c_contiguous and s.shape == (256, 256) and s.dtype == BF16
    assert not np.shares_memory(s, full) and np.array_equal(_bits(s), _bits(full[256:]))
    down = TEXT + "layers.0.mlp.down_proj.weight"
    assert np.array_equal(_bits(tiny_ckpt.read_shard(down, 0, 2)), _bits(tiny_ckpt.tensor(down)[:, :128]))
    assert tiny_ckpt.read_shard(TEXT + "layers.0.self_attn.A_log", 1, 2).dtype == np.float32
    assert tiny_ckpt.shard_nbytes(0, 2) == sum(
        math.prod(s.shard_shape(2)) * np.dtype(DTYPES[s.dtype]).itemsize for s in names.all_specs(tiny_ckpt.config))


def test_the_model_reads_each_tensor_once_through_read_shard(tiny_ckpt, monkeypatch):
    """Building a rank's model streams its weights: one read_shard per text tensor, none of the vision tower,
    and no call to the full-tensor accessor outside read_shard."""
    from cupyglm.backend.numpy_ops import NumpyOps
    from cupyglm.distributed.comm import LocalComm
    from cupyglm.kv.store import KVStore
    from cupyglm.model.glm import GLMModel

    reads: list[str] = []
    real = Checkpoint.read_shard

    def counting(self, name, rank, tp):
        reads.append(name)
        return real(self, name, rank, tp)

    monkeypatch.setattr(Checkpoint, "read_shard", counting)
    cfg = tiny_ckpt.config
    ops = NumpyOps()
    comm = LocalComm()
    GLMModel(cfg, tiny_ckpt.shard(comm.rank, comm.size), ops, comm, KVStore(cfg, ops, 4, cfg.page_tokens), mtp=True)
    assert sorted(reads) == sorted(tiny_ckpt.names())


def test_read_pages_leave_the_resident_set(tiny_dir):
    """Reading every tensor through the map touches all its pages; read_shard releases them again."""
    def grown(read) -> int:
        ckpt = Checkpoint.open(tiny_dir)                  # a fresh map: none of its pages are resident yet
        before = _rss_file_kib()
        kept = [read(ckpt, name) for name in ckpt.table]
        grew = _rss_file_kib() - before
        del kept
        return grew

    total_kib = sum(math.prod(s.shape) * np.dtype(DTYPES[s.dtype]).itemsize
                    for s in Checkpoint.open(tiny_dir).table.values()) // 1024
    touched = grown(lambda ck, n: float(ck.tensor(n).astype(np.float32).sum()))
    streamed = grown(lambda ck, n: ck.read_shard(n, 0, 1).nbytes)
    assert touched > 0.8 * total_kib, (touched, total_kib)
    assert streamed < 0.1 * total_kib, (streamed, total_kib)
