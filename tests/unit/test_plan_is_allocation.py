"""The plan is the allocation: the bytes of every array the runner, the KV store and the states hold equal what the
memory plan counts (weights and KV pages exactly, the states within the scratch the plan names)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from model_helpers import build_models

from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.backend.sim_ops import SimOps
from cupyglm.checkpoint.loader import Checkpoint
from cupyglm.checkpoint.quant import layout_of
from cupyglm.checkpoint.tiny import write_tiny
from cupyglm.config import preset
from cupyglm.engine.llm import LLM
from cupyglm.engine.plan import plan_memory
from cupyglm.engine.sampling import SamplingParams
from cupyglm.memory import storage_of

# A random model of the architecture, smaller than the tiny one and shaped differently (4 layers, DSA at 3).
SMALL = dict(hidden_size=64, num_hidden_layers=4, vocab_size=512, num_attention_heads=2, q_lora_rank=32,
             kv_lora_rank=32, qk_nope_head_dim=16, v_head_dim=16, index_n_heads=2, index_head_dim=16,
             index_topk=16, kda_num_heads=2, kda_head_dim=16, n_routed_experts=4, num_experts_per_tok=2,
             moe_intermediate_size=32, intermediate_size=128, attn_chunk=16, page_tokens=8, keep_grid=32)


def held_bytes(obj, seen: set) -> int:
    """Bytes of every array reachable from obj, each buffer counted once (a view counts as its base)."""
    total, stack = 0, [obj]
    while stack:
        o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if isinstance(o, np.ndarray):
            root = o
            while isinstance(root.base, np.ndarray):
                root = root.base
            if id(root) not in seen or root is o:
                seen.add(id(root))
                total += root.nbytes
            continue
        if hasattr(o, "data") and hasattr(getattr(o, "data"), "mem"):          # a cupy array: its allocation
            mem = o.data.mem
            if id(mem) not in seen:
                seen.add(id(mem))
                total += mem.size
            continue
        if isinstance(o, dict):
            stack += list(o.keys()) + list(o.values())
        elif isinstance(o, (list, tuple, set, frozenset)):
            stack += list(o)
        elif hasattr(o, "__dict__") and not isinstance(o, type):
            stack += list(vars(o).values())
    return total


def store_arrays(kv) -> list:
    return list(kv.latent.values()) + list(kv.pooled.values())


def check_runner(runner, states, plan, parallel):
    seen: set = set()
    kv = held_bytes(store_arrays(runner.kv), seen)
    assert kv == plan.kv_bytes, (kv, plan.kv_bytes)
    tails = held_bytes([runner.kv.tails.all], seen)      # `parallel` index-tail slots, inside the states' share
    assert tails == plan.tail_bytes > 0, (tails, plan.tail_bytes)
    weights = held_bytes(runner, seen)                    # everything else the runner holds: the weights
    assert weights == plan.weights_bytes, (weights, plan.weights_bytes)
    assert len(states) == parallel
    for st in states:
        assert 0 < held_bytes(st, seen) <= plan.state_bytes
    assert held_bytes(states, set()) <= parallel * plan.state_bytes <= plan.scratch_bytes


def run_partway(llm, parallel: int, lengths: list[int]):
    """Start `parallel` requests (prompt lengths leave incomplete pools) and step until all are decoding."""
    eng = llm.engine
    rng = np.random.default_rng(3)
    for n in lengths[:parallel]:
        eng.add_request(rng.integers(0, 256, n).tolist(), SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))
    for _ in range(6):
        eng.step()
    return list(eng._states.values())


@pytest.mark.parametrize("which", ["tiny", "small", "fp8", "nvfp4"])
def test_engine_plan_equals_what_it_allocates(which, tiny_dir, tmp_path):
    if which == "tiny":
        path = tiny_dir
    elif which in ("fp8", "nvfp4"):                     # quantised projections: packed values + scales as stored
        path = write_tiny(tmp_path / which, quant=which)
    else:
        tiny = preset("tiny")
        cfg = dataclasses.replace(tiny, layer_types=("linear_attention",) * 3 + ("full_attention",),
                                  first_k_dense_replace=2, **SMALL,
                                  vision=dataclasses.replace(tiny.vision, out_hidden_size=SMALL["hidden_size"]))
        path = write_tiny(tmp_path / "small", seed=5, config=cfg)
    llm = LLM(model=str(path), backend="numpy", parallel=3, kv_gib=0.002, log=False)
    try:
        plan = llm.plan
        assert plan.storage == storage_of(NumpyOps()).describe()
        states = run_partway(llm, 3, [21, 13, 30])
        assert any(st.index_tail for st in states)
        check_runner(llm.engine.runner, states, plan, 3)
    finally:
        llm.close()


@pytest.mark.parametrize("quant", [None, "fp8", "nvfp4"])
def test_tp2_shards_equal_their_plan(tiny_dir, tmp_path, quant):
    """Each rank of TP=2 holds what the TP=2 plan counts for it."""
    ckpt = Checkpoint.open(write_tiny(tmp_path / quant, quant=quant) if quant else tiny_dir)
    storage = storage_of(NumpyOps())
    plan = plan_memory(ckpt.config, storage=storage, tp=2, kv_budget_bytes=1 << 22, kv_pages=24, page_tokens=16,
                       quant=layout_of(ckpt))
    models = build_models(ckpt, tp=2, num_pages=24)
    for m in models:
        seen: set = set()
        assert held_bytes(store_arrays(m.kv), seen) == plan.kv_bytes
        held_bytes([m.kv.tails.all], seen)                 # the index-tail slots (a store outside the engine: 16)
        assert held_bytes(m, seen) == plan.weights_bytes
        st = m.new_state()
        assert held_bytes(st, seen) <= plan.state_bytes


def test_every_backend_reports_its_storage():
    """The storage is read from the backend: sim stores as numpy does (it runs the same arrays)."""
    assert storage_of(SimOps()) == storage_of(NumpyOps())


@pytest.mark.parametrize("host", [False, True])
def test_prompt_cache_arena_equals_its_plan(tiny_dir, host):
    """The kept-state arena holds the bytes the plan sets aside (device) or names (host), and kept states fill
    whole kept pages of it."""
    from cupyglm.engine.plan import PlanError
    from cupyglm.kv.kept import KeptStore
    from cupyglm.kv.store import KVStore

    ckpt = Checkpoint.open(tiny_dir)
    ops = NumpyOps()
    plan = plan_memory(ckpt.config, storage=storage_of(ops), kv_budget_bytes=1 << 22, page_tokens=16,
                       prompt_cache_gib=0.001, host_cache=host)
    kv = KVStore(ckpt.config, ops, plan.num_pages, plan.page_tokens)
    kept = KeptStore(ckpt.config, ops, kv, 1, plan.prompt_cache_bytes, host=host)
    assert held_bytes(kept.arena, set()) == kept.nbytes == plan.prompt_cache_bytes > 0
    assert kept.page_bytes == plan.page_bytes
    assert ("in host memory" in plan.line()) == host
    with pytest.raises(PlanError, match="holds no kept page"):
        plan_memory(ckpt.config, storage=storage_of(ops), kv_budget_bytes=1 << 22, page_tokens=16,
                    prompt_cache_gib=1e-9)


def test_kv_host_store_equals_its_plan(tiny_dir):
    """CUPYGLM_KV_HOST: the device holds the pooled keys the plan counts and the gather's buffers (slots, slot
    rows, marks, miss flags, the row caches) it puts in the scratch; the host holds the latent rows of every page."""
    from cupyglm.kv.store import KVStore

    ckpt = Checkpoint.open(tiny_dir)
    cfg, ops = ckpt.config, NumpyOps()
    plan = plan_memory(cfg, storage=storage_of(ops), kv_budget_bytes=1 << 22, page_tokens=16, kv_host=True,
                       kv_host_bytes=24 * 16 * 384, context=256)
    assert plan.num_pages == plan.host_pages == 24 and plan.gather_slots == 256
    kv = KVStore(cfg, ops, plan.num_pages, plan.page_tokens, host_slots=plan.gather_slots)
    h = kv.host
    assert held_bytes(list(kv.pooled.values()), set()) == plan.kv_bytes
    gather = [h.slots, h.slot_row, h.marks, h.slot_miss, *h.cache.values(), *h.cache_rows.values(), *h.cmark.values()]
    assert held_bytes(gather, set()) == plan.gather_bytes
    assert held_bytes(list(h.latent.values()), set()) == 24 * 16 * plan.host_bytes_per_token
