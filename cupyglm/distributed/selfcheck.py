"""`python -m cupyglm.distributed.selfcheck [shared flags]`: a rank program that exercises the distributed layer.

It starts the world (handshake), refuses unavailable settings, maps a shared segment, checks the rank-order
all-reduce against a local replay, broadcasts step messages, and prints a digest every rank must agree on.
`--loop-seconds N` keeps stepping (rank 0's step message carries the stop); `--fail-rank R` plants an exception.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time

import ml_dtypes
import numpy as np

from cupyglm.distributed import step as stepmod
from cupyglm.distributed.comm import ordered_sum
from cupyglm.distributed.failure import run_rank_main, stop_requested
from cupyglm.distributed.world import start
from cupyglm.settings import Settings, add_arguments


def _partial(seed: int, rank: int, n: int) -> np.ndarray:
    rng = np.random.default_rng([seed, rank])
    # Mixed magnitudes, so a different summation order gives different bits.
    return (rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))).astype(np.float32)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cupyglm.distributed.selfcheck")
    add_arguments(parser)
    parser.add_argument("--elements", type=int, default=4096)
    parser.add_argument("--shm-bytes", type=int, default=1 << 16)
    parser.add_argument("--loop-seconds", type=float, default=0.0)
    parser.add_argument("--fail-rank", type=int, default=-1, help="rank that raises (-2: every rank)")
    parser.add_argument("--fail-after", type=float, default=0.0)

    def body() -> int:
        ns = parser.parse_args(argv)
        world = start(Settings.from_args(ns))
        world.settings.refuse_unavailable()
        assert world.host_comm is not None
        seg = _check_segment(world, ns.shm_bytes)
        h = hashlib.sha256()
        part = _check_collectives(world, ns.elements, h)
        _check_step_message(world, h)
        print(f"rank {world.rank}: DIGEST {h.hexdigest()[:16]}", flush=True)
        steps = 0
        if ns.loop_seconds > 0:
            steps = _loop(world, part, ns)
        elif ns.fail_rank in (world.rank, -2):
            raise RuntimeError(f"planted failure on rank {world.rank}")
        seg.close()
        print(f"rank {world.rank}: done after {steps} steps", flush=True)
        return 0

    return run_rank_main(body)


def _check_segment(world, shm_bytes: int):
    """Map the shared segment, every local rank writes its slot, all must see all; prints the ready line."""
    rank, comm = world.rank, world.host_comm
    seg = world.shared_segment("selfcheck", max(shm_bytes, 8 * world.local_size))
    slots = seg.array(np.int64, (world.local_size,))
    slots[world.local_rank] = rank + 1000
    comm.barrier()
    seen = sorted(int(v) for v in slots)
    if seen != sorted(set(seen)) or len(seen) != world.local_size or min(seen) < 1000:
        raise RuntimeError(f"shared segment slots disagree: {seen}")
    exists = os.path.exists(seg.path)
    print(f"rank {rank}: pid {os.getpid()} ready size {world.size} local {world.local_rank}/{world.local_size} "
          f"token {world.token} shm {seg.name} shm_name_left {int(exists)} "
          f"handshake_ms {world.handshake_ms:.3f}", flush=True)
    return seg


def _check_collectives(world, elements: int, h) -> np.ndarray:
    """Every collective against what it must give (the sum in rank order); their bytes go into the digest."""
    rank, size, comm, seed = world.rank, world.size, world.host_comm, world.settings.seed
    part = _partial(seed, rank, elements)
    total = comm.allreduce_sum(part)
    replay = ordered_sum(np.stack([_partial(seed, r, elements) for r in range(size)]))
    if total.tobytes() != replay.tobytes():
        raise RuntimeError("allreduce_sum is not the rank-order sum")
    h.update(total.tobytes())
    bf = comm.allreduce_sum(part.astype(ml_dtypes.bfloat16))
    h.update(bf.tobytes())
    cat = comm.concat_last(part[:8].reshape(2, 4))
    if cat.shape != (2, 4 * size):
        raise RuntimeError(f"concat_last shape {cat.shape}")
    h.update(cat.tobytes())
    gathered = comm.allgather(np.array([rank], dtype=np.int32))
    if gathered.ravel().tolist() != list(range(size)):
        raise RuntimeError(f"allgather gave {gathered.ravel().tolist()}")
    return part


def _check_step_message(world, h) -> None:
    """Rank 0's first step message, broadcast: every rank must decode what rank 0 encoded."""
    first = stepmod.Frame(step=0, records=((1, bytes(range(10))), (7, world.settings.seed.to_bytes(8, "little"))))
    blob = world.host_comm.bcast_bytes(stepmod.encode(first) if world.rank == 0 else None)
    if stepmod.decode(blob) != first:
        raise RuntimeError("step message differs after broadcast")
    h.update(blob)


def _loop(world, part: np.ndarray, ns: argparse.Namespace) -> int:
    """Step until rank 0's message carries the stop (a stop signal or --loop-seconds); the steps run in order."""
    rank, comm = world.rank, world.host_comm
    steps = 0
    t0 = time.monotonic()
    x = part[:256].copy()
    while True:
        steps += 1
        out = None
        if rank == 0:
            done = stop_requested() or time.monotonic() - t0 > ns.loop_seconds
            out = stepmod.encode(stepmod.Frame(step=steps, stop=done, records=((7, bytes(4)),)))
        msg = stepmod.decode(comm.bcast_bytes(out))
        if msg.step != steps:
            raise RuntimeError(f"step {msg.step} after step {steps - 1}: the ranks are out of step")
        if msg.stop:
            return steps
        if ns.fail_rank in (rank, -2) and time.monotonic() - t0 >= ns.fail_after:
            raise RuntimeError(f"planted failure on rank {rank}")
        x = comm.allreduce_sum(x) * np.float32(0.5)
        time.sleep(0.001)


if __name__ == "__main__":
    sys.exit(main())
