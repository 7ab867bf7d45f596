"""Ranks: world (start, ranks, devices), comm (rank-order collectives: MPI, NCCL, local), fingerprint (the
settings handshake), step (the versioned lockstep message), shm (shared host memory), failure (shutdown).

Importing this package imports no MPI; only `world.start` under an MPI launcher does.
"""
