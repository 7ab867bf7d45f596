"""Peak host memory of loading one rank's shard, against the shard's bytes.

    python bench/load_rss.py [--models tiny,big] [--tp 2] [--dir DIR]

For each model (the tiny checkpoint, and the ~1B random model of bench/big_random.py written once as a
checkpoint directory) and each rank of `--tp`, a fresh process opens the checkpoint, notes its resident set
after the imports and the header parse (VmRSS: the baseline), builds that rank's model weights on the numpy
backend (GLMModel over a one-page KV store), and reports:

  peak      VmHWM of the process (the high-water mark of its resident set, file-backed pages included)
  load      peak - baseline: what loading the shard cost at its worst moment
  held      bytes of the arrays the built model keeps (the weights in the backend's storage)
  stored    the rank's shard in the checkpoint's dtypes (bf16 / the F32 small tensors)
  largest   the largest single tensor slice of the shard, stored (one tensor is in flight at a time)

Prints one `RSS <model> rank r/tp ...` line per rank and a last `SUMMARY` line; the bytes per element the
backend keeps a weight in are stated there (held / stored elements).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _held_bytes(model) -> tuple[int, int]:
    """(bytes, elements) of the distinct numpy buffers reachable from the model's layers (not its KV store)."""
    import numpy as np

    seen: dict[int, np.ndarray] = {}
    stack, visited = [model], set()
    while stack:
        obj = stack.pop()
        if id(obj) in visited:
            continue
        visited.add(id(obj))
        if isinstance(obj, np.ndarray):
            root = obj
            while isinstance(root.base, np.ndarray):
                root = root.base
            seen[id(root)] = root
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif type(obj).__module__.startswith("cupyglm.model"):
            stack.extend(v for k, v in vars(obj).items() if k not in ("kv", "comm", "ops", "cfg"))
    return sum(a.nbytes for a in seen.values()), sum(a.size for a in seen.values())


def child(path: str, rank: int, tp: int) -> dict:
    """One rank's load in this (fresh) process."""
    from cupyglm.backend.numpy_ops import NumpyOps
    from cupyglm.checkpoint import names
    from cupyglm.checkpoint.loader import DTYPES, Checkpoint
    from cupyglm.kv.store import KVStore
    from cupyglm.model.glm import GLMModel

    class RankComm:                     # the model reads only rank and size while it is built
        def __init__(self):
            self.rank, self.size = rank, tp

    ckpt = Checkpoint.open(path)
    cfg = ckpt.config
    specs = names.all_specs(cfg)
    slices = [(math.prod(s.shard_shape(tp)), DTYPES[getattr(s, "dtype", "BF16")].itemsize) for s in specs]
    stored = sum(n * size for n, size in slices)
    base = _status_kib("VmRSS")
    ops = NumpyOps()
    model = GLMModel(cfg, ckpt.shard(rank, tp), ops, RankComm(), KVStore(cfg, ops, 1, cfg.page_tokens), mtp=True)
    peak = _status_kib("VmHWM")
    held, elements = _held_bytes(model)
    return {"rank": rank, "tp": tp, "baseline": base * 1024, "peak": peak * 1024, "held": held,
            "held_elements": elements, "stored": stored, "stored_elements": sum(n for n, _ in slices),
            "largest": max(n * size for n, size in slices), "rss_after": _status_kib("VmRSS") * 1024}


def write_big(out: Path, seed: int = 0) -> Path:
    """The ~1B random model as a checkpoint directory in the published layout (the tiny tokenizer beside it;
    loading weights does not read it). Written in several files so the writer holds one file's tensors at a time."""
    from bench.big_random import big_config
    from cupyglm.checkpoint import names
    from cupyglm.checkpoint.loader import DTYPES, INDEX_FILE, write_safetensors
    from cupyglm.checkpoint.tiny import default_tiny_dir, init_tensor, shard_file_name

    cfg = big_config()
    specs = names.checkpoint_specs(cfg)
    files = 8
    total = sum(math.prod(s.shape) * DTYPES[s.dtype].itemsize for s in specs)
    groups: list[list] = [[] for _ in range(files)]
    acc = 0
    for s in specs:
        groups[min(files - 1, acc * files // total)].append(s)
        acc += math.prod(s.shape) * DTYPES[s.dtype].itemsize
    out.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    for i, group in enumerate(groups):
        fname = shard_file_name(i, files)
        write_safetensors(out / fname, {s.name: init_tensor(s, cfg, seed) for s in group}, {"format": "pt"})
        weight_map.update({s.name: fname for s in group})
    (out / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    (out / "config.json").write_text(json.dumps(cfg.to_hf_dict(), indent=2))
    tiny = default_tiny_dir()
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny / f, out / f)
    return out


def _run(args: list[str]) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args], env=env, capture_output=True,
                          text=True, check=False)
    if done.returncode:
        raise SystemExit(f"load_rss {' '.join(args)} failed:\n{done.stderr[-4000:]}")
    return done.stdout


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="tiny,big")
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--dir", help="where to write the ~1B checkpoint (kept); default a temp dir, removed after")
    p.add_argument("--child", nargs=3, metavar=("PATH", "RANK", "TP"), help=argparse.SUPPRESS)
    p.add_argument("--write-big", metavar="DIR", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.child[0], int(a.child[1]), int(a.child[2]))))
        return 0
    if a.write_big:
        write_big(Path(a.write_big))
        return 0

    tmp = None
    results = []
    try:
        for model in a.models.split(","):
            if model == "tiny":
                from cupyglm.checkpoint.tiny import default_tiny_dir
                path = default_tiny_dir()
            elif model == "big":
                if a.dir is None:
                    tmp = tempfile.mkdtemp(prefix="cupyglm-load-rss-")
                path = Path(a.dir or tmp) / "big"
                if not (path / "config.json").is_file():
                    _run(["--write-big", str(path)])            # in its own process: the writer's memory is not ours
            else:
                raise SystemExit(f"unknown model {model!r} (tiny, big)")
            for rank in range(a.tp):
                r = json.loads(_run(["--child", str(path), str(rank), str(a.tp)]).strip().splitlines()[-1])
                r["model"] = model
                results.append(r)
                print(f"RSS {model} rank {rank}/{a.tp}: peak {r['peak'] / MIB:.1f} MiB, baseline "
                      f"{r['baseline'] / MIB:.1f}, load {(r['peak'] - r['baseline']) / MIB:.1f} MiB; held "
                      f"{r['held'] / MIB:.1f} MiB ({r['held'] / r['held_elements']:.2f} B/element), stored shard "
                      f"{r['stored'] / MIB:.1f} MiB ({r['stored'] / r['stored_elements']:.2f} B/element), largest "
                      f"slice {r['largest'] / MIB:.1f} MiB; load / held {(r['peak'] - r['baseline']) / r['held']:.3f}",
                      flush=True)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    worst = max((r["peak"] - r["baseline"]) / r["held"] for r in results)
    per = {r["model"]: round(r["held"] / r["held_elements"], 2) for r in results}
    print(f"SUMMARY load_rss tp={a.tp} worst load/held {worst:.3f}; backend bytes/element held {per}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
