"""Idle ranks and step-start latency: `mpirun -n 2 python bench/idle_probe.py [--blocking]`.

Rank 0 plays the engine: it stays idle for --idle-s seconds (rank 1 waits in `MpiComm.bcast_bytes` for the next
step message), then broadcasts --messages messages, each holding its send time (CLOCK_MONOTONIC, shared by the
processes of one host), with gaps drawn from --gaps-ms (under load: steps come back to back; after a pause:
the first step of a busy period). Rank 1 records receive - send. `--blocking` runs MPI's blocking Bcast for the
length as the comm did before (the busy-polling baseline). Prints one JSON line from rank 1: the idle CPU % of
rank 1 (process CPU time / wall time while waiting) and the latency percentiles in microseconds per gap.
"""
from __future__ import annotations

import argparse
import json
import struct
import time

import numpy as np
from mpi4py import MPI

from cupyglm.distributed.comm import MpiComm


class BlockingComm(MpiComm):
    def bcast_bytes(self, b):
        n = np.array([len(b) if self.rank == 0 else -1], dtype=np.int64)
        self.mpi.Bcast(n, root=0)
        buf = np.frombuffer(bytearray(b), dtype=np.uint8) if self.rank == 0 else np.empty(int(n[0]), np.uint8)
        if n[0]:
            self.mpi.Bcast(buf, root=0)
        return buf.tobytes()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--idle-s", type=float, default=3.0)
    ap.add_argument("--messages", type=int, default=300)
    ap.add_argument("--gaps-ms", default="0,0.2,1,5,20")
    ap.add_argument("--blocking", action="store_true")
    a = ap.parse_args()
    comm = (BlockingComm if a.blocking else MpiComm)(MPI.COMM_WORLD)
    gaps = [float(g) / 1000 for g in a.gaps_ms.split(",")]
    comm.barrier()
    if comm.rank == 0:
        time.sleep(a.idle_s)
        comm.bcast_bytes(struct.pack("<d", time.monotonic()))
        for g in gaps:
            for _ in range(a.messages):
                time.sleep(g) if g else None
                comm.bcast_bytes(struct.pack("<d", time.monotonic()))
        comm.barrier()
        return
    w0, c0 = time.monotonic(), time.process_time()
    comm.bcast_bytes(None)                     # the idle wait
    w1, c1 = time.monotonic(), time.process_time()
    lat = {}
    for g in gaps:
        got = []
        for _ in range(a.messages):
            t = struct.unpack("<d", comm.bcast_bytes(None))[0]
            got.append(time.monotonic() - t)
        us = np.array(got) * 1e6
        lat[f"gap_{g * 1000:g}ms"] = {"p50_us": round(float(np.percentile(us, 50)), 1),
                                      "p99_us": round(float(np.percentile(us, 99)), 1),
                                      "max_us": round(float(us.max()), 1)}
    comm.barrier()
    print(json.dumps({"mode": "blocking" if a.blocking else "napping", "idle_s": round(w1 - w0, 3),
                      "idle_cpu_pct": round(100 * (c1 - c0) / (w1 - w0), 2), "latency": lat}), flush=True)


if __name__ == "__main__":
    main()
