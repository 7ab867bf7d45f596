"""Building a rank's engine at startup: the memory plan every rank agrees on, then the runner, the kept-state
store and the engine (engine.py is the lockstep loop they run)."""
from __future__ import annotations

import sys

from cupyglm.engine.config import EngineConfig
from cupyglm.engine.engine import Engine


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
              reserve_gib=st.memory_reserve_gib, prompt_cache_gib=st.prompt_cache_gib, host_cache=st.host_cache,
              chunk_rows=chunk, mtp=mtp, pool_cap=cpu, quant=layout_of(ckpt))
    try:                                   # what fits this rank; refusals wait until the ranks agree
        local_fit, local_error = plan_memory(cfg, **{**kw, "context": 0, "kv_pages": 0}).fit_pages, None
    except PlanError as e:
        local_fit, local_error = 0, e
    fit = agree(local_fit, world.host_comm)
    if fit < 1:
        raise local_error or PlanError("another rank has no room for KV pages")
    return plan_memory(cfg, **kw, fit_pages=fit)


def build(world, ckpt, *, poison: bool = False, log=log_line):
    """The engine of this rank (plan, runner, engine); prints this rank's plan line. Returns (engine, plan)."""
    from cupyglm.backend import make_ops
    from cupyglm.engine.runner import ModelRunner

    st, cfg = world.settings, ckpt.config
    ops = make_ops(world.backend)
    plan = plan_for(world, ckpt, ops)
    if log is not None:
        log(plan.line())
    runner = ModelRunner(ckpt, ops, world.comm, plan.num_pages, plan.page_tokens, poison=poison)
    kept = None
    if plan.prompt_cache_bytes:
        from cupyglm.kv.kept import KeptStore

        kept = KeptStore(cfg, ops, runner.kv, world.size, plan.prompt_cache_bytes, host=st.host_cache)
    ecfg = EngineConfig(context=plan.context, num_pages=plan.num_pages, page_tokens=plan.page_tokens,
                        keep_grid=cfg.keep_grid, parallel=st.parallel, max_queue=st.max_queue,
                        prefill_chunk=st.prefill_chunk, seed=st.seed, eos_token_ids=cfg.eos_token_ids,
                        vocab_size=cfg.vocab_size, poison=poison)
    return Engine(runner, world.comm, ecfg, ckpt.tokenizer if world.rank == 0 else None, log=log, kept=kept), plan
