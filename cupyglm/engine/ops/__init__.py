"""The step message's operations: one module each, holding its payload's layout (`LAYOUT`, the docs' table
row), its encode / decode and what every rank does with it (`apply`, on `cupyglm.engine.worker.Worker`).

A step message is an ordered tuple of operations; every rank, rank 0 included, applies them in that order
(`cupyglm.engine.ops.codec.ORDER`): admit, image, cancel, settle, evict, restore, lease, run, spill, drop, unlink,
clear, load, sync, keep. Page ids travel explicitly (restore, lease): rank 0's scheduler is the only allocator.
"""
