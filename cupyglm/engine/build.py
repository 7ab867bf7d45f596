"""Building a rank's engine at startup: the memory plan every rank agrees on, then the runner, the kept-state
store and the engine (engine.py is the lockstep loop they run)."""
from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable

from cupyglm.engine.config import EngineConfig
from cupyglm.engine.engine import Engine


@dataclasses.dataclass(frozen=True)
class Observers:
    """What a test watches or provokes in a serving rank (tests/observed_serve.py wires them in); the default
    watches nothing and changes nothing."""

    kv_host_writes: bool = False          # each rank logs a digest of the host KV rows it wrote in each step
    kv_host_slots: int | None = None      # fewer gather slots than the plan's (to provoke the slot guard's refusal)
    disk_write_pause_s: float = 0.0       # the disk tier's writer sleeps half way through each state file
    shm_before_map: Callable[[int, str], None] | None = None   # (local rank, name) before a rank maps a shared file

    def __post_init__(self) -> None:
        if self.kv_host_slots is not None and self.kv_host_slots < 1:
            raise ValueError(f"kv_host_slots must be a positive integer, got {self.kv_host_slots}")


NO_OBSERVERS = Observers()


def log_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def plan_for(world, ckpt, ops, *, parallel: int | None = None, mtp: bool = False):
    """The memory plan of this rank for `world.settings`, every array at `ops`'s storage, agreed across ranks
    (the minimum of their fits)."""
    from cupyglm.engine.plan import GIB, PlanError, agree, mem_available, plan_memory
    from cupyglm.checkpoint.quant import layout_of
    from cupyglm.memory import storage_of

    st, cfg = world.settings, ckpt.config
    parallel = parallel or st.parallel
    grid = cfg.keep_grid
    chunk = EngineConfig(context=1, num_pages=1, page_tokens=1, keep_grid=grid, prefill_chunk=st.prefill_chunk).chunk
    cpu = world.backend in ("numpy", "sim")
    if st.kv_gib is not None:
        budget = None
    elif cpu:
        budget = mem_available()
    else:
        import cupy

        budget = int(cupy.cuda.runtime.memGetInfo()[0])
    kw = dict(storage=storage_of(ops), tp=world.size, rank=world.rank, budget_bytes=budget,
              kv_budget_bytes=None if st.kv_gib is None else int(st.kv_gib * GIB), parallel=parallel,
              context=st.context, page_tokens=st.page_tokens, kv_pages=st.kv_pages, kv_host=st.kv_host,
              kv_host_bytes=None if st.kv_host_gib is None else int(st.kv_host_gib * GIB),
              reserve_gib=st.memory_reserve_gib, prompt_cache_gib=st.prompt_cache_gib, host_cache=st.host_cache,
              chunk_rows=chunk, mtp=mtp, pool_cap=cpu, quant=layout_of(ckpt),
              graphs=cuda_graphs(world.backend, st.cuda_graphs),
              vision=vision_on(st, cfg) and world.rank == 0, vision_host=st.vision_host)
    try:                                   # what fits this rank; refusals wait until the ranks agree
        local_fit, local_error = plan_memory(cfg, **{**kw, "context": 0, "kv_pages": 0}).fit_pages, None
    except PlanError as e:
        local_fit, local_error = 0, e
    fit = agree(local_fit, world.host_comm)
    if fit < 1:
        raise local_error or PlanError("another rank has no room for KV pages")
    return plan_memory(cfg, **kw, fit_pages=fit)


def host_slots(plan, observers: Observers = NO_OBSERVERS) -> int:
    """The gather's slots: the plan's (the window), or fewer for a test (Observers.kv_host_slots)."""
    if observers.kv_host_slots is None:
        return plan.gather_slots
    return min(observers.kv_host_slots, plan.gather_slots)


def shared_line(world, seg) -> str:
    """A rank's line for its host's shared KV rows (which file, on which host, made here or mapped)."""
    how = "made and unlinked it" if seg.unlinked_here else "mapped it"
    return (f"rank {world.rank}: kv host rows shared in {seg.path} host {seg.header.host} local "
            f"{world.local_rank}/{world.local_size} mappings {seg.mapped()}/{seg.header.local_size}, {how}")


def cuda_graphs(backend: str, asked: bool | None = None) -> bool:
    """--cuda-graphs (Settings.cuda_graphs; `asked` None: not given, its alias CUPYGLM_CUDA_GRAPHS decides) on cuda:
    decode calls replay captured layers and ends (engine/graph_capture.py, graph_ends.py).
    Not fingerprinted: ranks may differ in it, since a replay computes the same bits as the eager call."""
    from cupyglm.settings import env_bool

    return (env_bool("CUPYGLM_CUDA_GRAPHS") if asked is None else asked) and backend == "cuda"


def build(world, ckpt, *, poison: bool = False, log=log_line, observers: Observers = NO_OBSERVERS):
    """The engine of this rank (plan, runner, engine); prints this rank's plan line. Returns (engine, plan)."""
    from cupyglm.backend import make_ops
    from cupyglm.backend.arithmetic import unconfirmed_note
    from cupyglm.engine.runner import ModelRunner
    from cupyglm.kv.host_rows import WriteHash

    st, cfg = world.settings, ckpt.config
    ops = make_ops(world.backend)
    mtp = st.mtp_drafts > 0                # the MTP head (weights, KV rows, pending row) only when drafting
    plan = plan_for(world, ckpt, ops, mtp=mtp)    # counts rank 0's tower (or its staging slots) as a weight
    encoder = image_encoder(world, ckpt, ops)
    if log is not None:
        log(plan.line())
        note = unconfirmed_note(world.backend) if world.rank == 0 else None
        if note is not None:
            log(note)
    runner = ModelRunner(ckpt, ops, world.comm, plan.num_pages, plan.page_tokens, mtp=mtp, poison=poison,
                         host_slots=host_slots(plan, observers) if st.kv_host else 0,
                         host_shared=(lambda n: world.shared_segment("kv_host", n)) if st.kv_host_shared else None,
                         host_writes=WriteHash(ops.xp) if observers.kv_host_writes else None,
                         graphs=cuda_graphs(world.backend, st.cuda_graphs), tail_slots=st.parallel)
    seg = runner.kv.host.segment if runner.kv.host is not None else None
    if seg is not None and log is not None:
        log(shared_line(world, seg))
    kept = disk = planner = None
    if plan.prompt_cache_bytes:
        from cupyglm.kv.kept import KeptStore

        kept = KeptStore(cfg, ops, runner.kv, world.size, plan.prompt_cache_bytes, host=st.host_cache,
                         mtp=mtp, share=st.kv_share)
    if kept is not None and st.prompt_cache_dir is not None:
        disk, planner = build_disk(world, ckpt, kept, plan.page_tokens, log or (lambda line: None),
                                   pause_s=observers.disk_write_pause_s)
    ecfg = EngineConfig(context=plan.context, num_pages=plan.num_pages, page_tokens=plan.page_tokens,
                        keep_grid=cfg.keep_grid, parallel=st.parallel, max_queue=st.max_queue,
                        prefill_chunk=st.prefill_chunk, seed=st.seed, eos_token_ids=cfg.eos_token_ids,
                        vocab_size=cfg.vocab_size, poison=poison, mtp_drafts=st.mtp_drafts)
    return Engine(runner, world.comm, ecfg, ckpt.tokenizer if world.rank == 0 else None, log=log, kept=kept,
                  disk=disk, planner=planner, host_comm=world.host_comm, encoder=encoder), plan


def vision_on(settings, cfg) -> bool:
    """--vision / --no-vision, default on when the checkpoint has a tower; asked for without one (or
    --vision-host without the tower on): refused."""
    from cupyglm.settings import SettingsError

    if settings.vision and cfg.vision is None:
        raise SettingsError("--vision: the checkpoint has no vision tower (no vision_config)", agreed=True)
    on = cfg.vision is not None and settings.vision is not False
    if settings.vision_host and not on:
        why = "--no-vision" if cfg.vision is not None else "the checkpoint has none (no vision_config)"
        raise SettingsError(f"--vision-host or CUPYGLM_VISION_HOST=1: no vision tower runs ({why})", agreed=True)
    return on


def image_encoder(world, ckpt, ops):
    """Rank 0's tower (every tensor whole, on this backend's device, or in host memory staged per unit with
    --vision-host) when vision is on; the other ranks take its rows from the step message."""
    on = vision_on(world.settings, ckpt.config)      # every rank refuses a --vision without a tower
    if world.rank != 0 or not on:
        return None
    from cupyglm.checkpoint.vision_weights import vision_weights
    from cupyglm.engine.images import ImageEncoder
    from cupyglm.vision.tower import VisionTower

    tower = VisionTower(ckpt.config.vision, vision_weights(ckpt), ops, host=world.settings.vision_host)
    return ImageEncoder(tower, ops)


def build_disk(world, ckpt, kept, page_tokens: int, log, pause_s: float = 0.0):
    """This rank's disk tier: index its files (headers only), agree with the other ranks on the usable ones
    (a collective), and on rank 0 the planner over them. Returns (DiskStore, DiskPlanner or None)."""
    from cupyglm.engine.disk_tier import agree_index, planner_from
    from cupyglm.engine.plan import GIB
    from cupyglm.kv.disk_file import checkpoint_identity, state_fingerprint
    from cupyglm.kv.disk_store import DiskStore
    from cupyglm.memory import BF16

    st = world.settings
    model = checkpoint_identity(ckpt.path, builtin=st.model is None)
    fp = state_fingerprint(model=model, backend=world.backend, arithmetic=world.fingerprint["arithmetic"],
                           tp=world.size, rank=world.rank,
                           page_tokens=page_tokens, kv_cache=st.kv_cache,
                           storage=f"bf16 in {kept.storage.itemsize(BF16)} bytes", mtp=kept.mtp)
    disk = DiskStore(st.prompt_cache_dir, fp, kept, world.rank, world.size, log, pause_s=pause_s)
    found = len(disk.index())
    usable = agree_index(disk, world.host_comm)
    planner = None
    if world.rank == 0:
        planner = planner_from(disk, int(st.prompt_cache_disk_gib * GIB), kept.state_bytes)
        log(f"prompt cache on disk: {st.prompt_cache_dir}, {len(usable)} state(s) usable by every rank "
            f"({found} valid here), budget {st.prompt_cache_disk_gib:g} GiB per rank")
    return disk, planner
