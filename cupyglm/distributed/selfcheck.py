"""`python -m cupyglm.distributed.selfcheck [shared flags]`: a rank program that exercises the dist layer.

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
        settings = world.settings
        settings.refuse_unavailable()
        rank, size, comm = world.rank, world.size, world.host_comm
        assert comm is not None

        seg = world.shared_segment("selfcheck", max(ns.shm_bytes, 8 * world.local_size))
        slots = seg.array(np.int64, (world.local_size,))
        slots[world.local_rank] = rank + 1000
        comm.barrier()
        seen = sorted(int(v) for v in slots)
        if seen != sorted(set(seen)) or len(seen) != world.local_size or min(seen) < 1000:
            raise RuntimeError(f"shared segment slots disagree: {seen}")
        exists = os.path.exists(seg.path)
        print(f"rank {rank}: pid {os.getpid()} ready size {size} local {world.local_rank}/{world.local_size} "
              f"token {world.token} shm {seg.name} shm_name_left {int(exists)} "
              f"handshake_ms {world.handshake_ms:.3f}", flush=True)

        h = hashlib.sha256()
        part = _partial(settings.seed, rank, ns.elements)
        total = comm.allreduce_sum(part)
        replay = ordered_sum(np.stack([_partial(settings.seed, r, ns.elements) for r in range(size)]))
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

        first = stepmod.Frame(step=0, records=((1, bytes(range(10))), (7, settings.seed.to_bytes(8, "little"))))
        blob = comm.bcast_bytes(stepmod.encode(first) if rank == 0 else None)
        msg = stepmod.decode(blob)
        if msg != first:
            raise RuntimeError("step message differs after broadcast")
        h.update(blob)
        digest = h.hexdigest()[:16]
        print(f"rank {rank}: DIGEST {digest}", flush=True)

        steps = 0
        t0 = time.monotonic()
        if ns.loop_seconds > 0:
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
                    break
                if ns.fail_rank in (rank, -2) and time.monotonic() - t0 >= ns.fail_after:
                    raise RuntimeError(f"planted failure on rank {rank}")
                x = comm.allreduce_sum(x) * np.float32(0.5)
                time.sleep(0.001)
        elif ns.fail_rank in (rank, -2):
            raise RuntimeError(f"planted failure on rank {rank}")
        seg.close()
        print(f"rank {rank}: done after {steps} steps", flush=True)
        return 0

    return run_rank_main(body)


if __name__ == "__main__":
    sys.exit(main())
