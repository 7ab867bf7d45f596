"""The memory plan: how many KV pages fit beside the weights, the scratch buffers and the reserve.

    budget (card or host memory, per rank)
      - weights      (this rank's shard: the split table's shard shapes at the backend's storage)
      - vision       (rank 0 with the tower on: the tower, or with CUPYGLM_VISION_HOST its two staging slots)
      - scratch      (activations for the step's rows + the fixed state of `parallel` sequences, their index
                      tails included: the KV store's `parallel` tail slots, kv/index_tails.py)
      - reserve      (CUPYGLM_MEMORY_RESERVE_GIB)
      - prompt cache (--prompt-cache-gib, unless CUPYGLM_HOST_CACHE puts it in host memory)
      - cuda graphs  (CUPYGLM_CUDA_GRAPHS: the KDA seats exactly, the graphs' pools as a bound; plan_graphs.py)
      = room for KV pages (`cupyglm.memory.kv_arrays` of one page each)

Every array's bytes come from `cupyglm.memory`, at the storage of the backend that allocates them, so the plan
is what the weights, the KV store and the states allocate. With 16-bit storage a token takes 13,056 bytes for
glm-5.3-flash (every KV layer's latent row + its share of a pooled key); with --kv-host the card keeps only the
pooled keys (12 x 64 = 768 B/token) and the latent rows live in host memory. `context 0` is the largest window
that fits, capped at the model's maximum context; a context past either is refused by name. Under MPI each rank plans from its own free memory and the ranks take the minimum
(`agree`). The activation share is an estimate (named terms below).
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np

from cupyglm.config import ModelConfig
from cupyglm.engine.plan_graphs import describe, graph_bytes, graph_terms
from cupyglm.memory import (FP32, Storage, gather_arrays, host_latent_arrays, index_tail_array, kv_arrays,
                            prompt_cache_arena, state_arrays, total_bytes, vision_arrays, vision_host_arrays,
                            weight_arrays)

GIB = 1 << 30
MIB = 1 << 20


class PlanError(ValueError):
    """A plan that does not fit; the message names the setting and the largest value that fits."""


# ---- sizes (every array's bytes come from cupyglm.memory) ------------------------------------------------------

@functools.lru_cache(maxsize=32)
def weight_bytes(cfg: ModelConfig, tp: int, storage: Storage, quant=None, mtp: bool = False) -> int:
    """One rank's weights (`memory.weight_arrays`); quant (checkpoint.quant.QuantLayout): the quantised
    projections' stored bytes, values + scales."""
    return total_bytes(weight_arrays(cfg, tp, mtp, quant), storage)


def kv_page_bytes(cfg: ModelConfig, page_tokens: int, storage: Storage, kv_host: bool = False) -> int:
    """Bytes one page takes in the rank's KV pool (`memory.kv_arrays` of one page)."""
    return total_bytes(kv_arrays(cfg, 1, page_tokens, kv_host), storage)


def kv_bytes_per_token(cfg: ModelConfig, storage: Storage, kv_host: bool = False) -> int:
    """Bytes a token takes in the rank's KV pool: latent row + pooled-key share per KV layer (with kv_host the
    pooled keys only)."""
    return kv_page_bytes(cfg, cfg.index_kpool, storage, kv_host) // cfg.index_kpool


def host_kv_bytes_per_token(cfg: ModelConfig, storage: Storage) -> int:
    """With --kv-host: the latent rows each token keeps in host memory."""
    return total_bytes(host_latent_arrays(cfg, 1, 1), storage)


def fixed_state_bytes(cfg: ModelConfig, tp: int, storage: Storage, mtp: bool = False) -> int:
    """One sequence's fixed state at its largest (`memory.state_arrays`)."""
    return total_bytes(state_arrays(cfg, tp, mtp), storage)


def activation_bytes(cfg: ModelConfig, tp: int, rows: int, logit_rows: int, itemsize: int = 4) -> int:
    """Scratch for one step of `rows` rows (an estimate, every term at fp32 width): the 4 hyper-connection
    streams (3 live copies), the widest sublayer's intermediates, sparse attention scores, and full-vocab
    logits for `logit_rows` rows."""
    d = cfg.hidden_size
    streams = 3 * cfg.hc_mult * d
    kda = 7 * cfg.kda_num_heads * cfg.kda_head_dim // tp + 4 * cfg.kda_head_dim
    heads = cfg.num_attention_heads // tp
    dsa = 2 * heads * cfg.kv_lora_rank + heads * cfg.qk_nope_head_dim + cfg.q_lora_rank + cfg.kv_lora_rank \
        + cfg.index_n_heads * cfg.index_head_dim + heads * cfg.max_pick
    # MoE: all k (row, slot) pairs at once (grouped GEMMs): gathered rows, routed outputs and their scatter
    # (3 k D), gate/up fp32 + bf16 copies and the SwiGLU product (4 k inter/tp), router logits (E)
    kx = cfg.num_experts_per_tok
    moe = 3 * kx * d + 4 * kx * cfg.moe_intermediate_size // tp + cfg.n_routed_experts
    mlp = 2 * cfg.intermediate_size // tp
    per_row = streams + max(kda, dsa, moe, mlp) + 2 * d
    logits = logit_rows * (cfg.vocab_size + cfg.vocab_size // tp)
    return int((rows * per_row + logits) * itemsize)


def mem_available() -> int:
    """MemAvailable from /proc/meminfo, in bytes."""
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise PlanError("cannot read MemAvailable from /proc/meminfo; set --kv-gib")


# ---- the plan -------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    rank: int
    tp: int
    storage: str                      # how bf16 is stored ("bf16 stored in 2 bytes")
    budget_bytes: int                 # card or host memory considered (0: an explicit KV budget was given)
    weights_bytes: int
    scratch_bytes: int                # activations of the largest step + `parallel` fixed states
    state_bytes: int                  # one sequence's fixed state at its largest (in the scratch)
    reserve_bytes: int
    prompt_cache_bytes: int           # set aside on this budget (0 with the host cache)
    prompt_cache_host: bool
    page_tokens: int
    page_bytes: int                   # one page in the pool (on the card)
    bytes_per_token: int              # in the pool (on the card)
    host_bytes_per_token: int         # latent rows in host memory (--kv-host), else 0
    fit_pages: int                    # pages that fit this rank (before the ranks agree)
    num_pages: int                    # pages in the pool
    context: int                      # the window
    window_cap: str                   # what capped the window of `context 0` ("" when memory did)
    free_bytes: int                   # left over after everything
    explicit_kv_bytes: int = 0        # --kv-gib
    host_pages: int = 0               # --kv-host: pages the host rows hold (CUPYGLM_KV_HOST_GIB, one window unasked)
    gather_slots: int = 0             # --kv-host: the gather's slots (the window: host_rows.py's bound)
    gather_bytes: int = 0             # --kv-host: the gather's device buffers (in the scratch)
    graph_terms: tuple = ()           # CUDA graphs: (name, bytes, exact) per term (plan_graphs.graph_terms)
    tail_bytes: int = 0               # the KV store's index-tail slots of `parallel` sequences (in the scratch:
                                      # each slot is the tails' share of one sequence's state_bytes)
    vision_bytes: int = 0             # rank 0's tower on the card, or its staging slots with CUPYGLM_VISION_HOST
    vision_host_bytes: int = 0        # CUPYGLM_VISION_HOST: the tower in host memory

    @property
    def graph_bytes(self) -> int:
        return graph_bytes(self.graph_terms)

    @property
    def kv_bytes(self) -> int:
        return self.num_pages * self.page_bytes

    @property
    def largest_window(self) -> int:
        return self.num_pages * self.page_tokens

    def line(self) -> str:
        """The startup line of this rank."""
        cache = "no prompt cache"
        if self.prompt_cache_bytes or self.prompt_cache_host:
            where = " in host memory" if self.prompt_cache_host else ""
            cache = f"prompt cache {_gib(self.prompt_cache_bytes)}{where}"
        kv = f"pages {self.num_pages:,} x {_size(self.page_bytes)} = {_gib(self.kv_bytes)}"
        if self.host_bytes_per_token:
            kv += (f" (pooled keys; latent rows in host memory at {self.host_bytes_per_token:,} B/token, "
                   f"{self.host_pages:,} host pages = {_gib(self.host_pages * self.page_tokens * self.host_bytes_per_token)}; "
                   f"gather {self.gather_slots:,} slots = {_gib(self.gather_bytes)} in the scratch)")
        budget = f" of {_gib(self.budget_bytes)}" if self.budget_bytes else f" (--kv-gib {_gib(self.explicit_kv_bytes)})"
        cap = f" ({self.window_cap})" if self.window_cap else ""
        graphs = f", cuda graphs {_gib(self.graph_bytes)} ({describe(self.graph_terms)})" if self.graph_terms else ""
        return (f"rank {self.rank} plan ({self.storage}): weights {_gib(self.weights_bytes)}{self._vision()}, scratch "
                f"{_gib(self.scratch_bytes)}{graphs}, {kv}, window {self.context:,} tokens{cap}, {cache}, reserve "
                f"{_gib(self.reserve_bytes)}, free {_gib(self.free_bytes)}{budget}")

    def _vision(self) -> str:
        if self.vision_host_bytes:
            return (f", vision staging {_gib(self.vision_bytes)} (tower {_gib(self.vision_host_bytes)} in host "
                    f"memory)")
        return f", vision tower {_gib(self.vision_bytes)}" if self.vision_bytes else ""

    def summary(self) -> str:
        return (f"{self.bytes_per_token:,} bytes/token, {self.page_tokens} tokens/page, "
                f"{self.num_pages:,} pages, window {self.context:,} tokens")


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def _size(n: int) -> str:
    return f"{n / MIB:.2f} MiB" if n >= MIB else f"{n / 1024:.1f} KiB"


def _window(cfg: ModelConfig, context: int, largest: int) -> tuple[int, str]:
    """The window and what capped it: an explicit --context is refused past the model's maximum or the largest
    window that fits; context 0 is the largest that fits under the model's maximum (the pick has no cap)."""
    model_max = cfg.max_position_embeddings
    if context:
        if context > model_max:
            raise PlanError(f"--context {context:,} exceeds the model's maximum context of {model_max:,} tokens "
                            f"(max_position_embeddings in its config.json)")
        if context > largest:
            raise PlanError(f"--context {context} does not fit: the largest window is {largest:,} tokens")
        return context, ""
    caps = [(largest, ""), (model_max, "the model's maximum context")]
    return min(caps, key=lambda c: c[0])


def plan_memory(cfg: ModelConfig, *, storage: Storage, tp: int = 1, rank: int = 0, budget_bytes: int | None = None,
                kv_budget_bytes: int | None = None, parallel: int = 4, context: int = 0, page_tokens: int = 0,
                kv_pages: int = 0, kv_host: bool = False, kv_host_bytes: int | None = None,
                reserve_gib: float = 1.0, prompt_cache_gib: float = 0.0, host_cache: bool = False,
                chunk_rows: int = 2048, weights: int | None = None, quant=None,
                mtp: bool = False, pool_cap: bool = False, fit_pages: int | None = None,
                graphs: bool = False, vision: bool = False, vision_host: bool = False) -> MemoryPlan:
    """The plan of one rank, every array at the backend's `storage` (`memory.storage_of(ops)`). `budget_bytes`:
    the memory this rank plans in (card or host); `kv_budget_bytes` (--kv-gib) replaces the arithmetic with an
    explicit KV budget. `fit_pages` overrides the pages that fit (the minimum over ranks, see `agree`).
    `pool_cap` (CPU backends) sizes the pool to `parallel` full windows rather than all memory; `mtp`: the
    MTP head is built (its weights and state rows counted, and each stream's verify snapshot, engine/verify);
    `graphs`: decode calls replay CUDA graphs (their seats and pools counted before the pages, plan_graphs.py);
    `vision`: this rank holds the tower (rank 0 with it on), `vision_host` in host memory with two staging slots."""
    if tp < 1 or parallel < 1:
        raise PlanError(f"tp and parallel must be positive (got tp {tp}, parallel {parallel})")
    page_tokens = page_tokens or cfg.page_tokens
    if page_tokens % cfg.index_kpool:
        raise PlanError(f"--page-tokens must be a multiple of {cfg.index_kpool}, got {page_tokens}")
    page_bytes = kv_page_bytes(cfg, page_tokens, storage, kv_host)
    host_bpt = host_kv_bytes_per_token(cfg, storage) if kv_host else 0
    wbytes = weights if weights is not None else weight_bytes(cfg, tp, storage, quant, mtp)
    tower = total_bytes(vision_arrays(cfg, vision_host), storage) if vision else 0
    tower_host = total_bytes(vision_host_arrays(cfg), storage) if vision and vision_host else 0
    state = fixed_state_bytes(cfg, tp, storage, mtp)
    tails = total_bytes([index_tail_array(cfg, parallel, cfg.kv_layers if mtp else cfg.dsa_layers)], storage)
    host_pages, slots, gather = _host_rows(cfg, storage, page_tokens, context, kv_host, kv_host_bytes, host_bpt)
    scratch = activation_bytes(cfg, tp, chunk_rows + parallel, parallel, storage.itemsize(FP32)) + parallel * state
    scratch += gather
    snapshots = parallel * state if mtp else 0          # the head is built to draft: a verify snapshot per stream
    scratch += snapshots
    reserve = int(reserve_gib * GIB)
    cache = total_bytes([prompt_cache_arena(int(prompt_cache_gib * GIB), page_bytes)], storage)
    if prompt_cache_gib > 0 and not cache:
        raise PlanError(f"--prompt-cache-gib {prompt_cache_gib:g} holds no kept page of {_size(page_bytes)} "
                        f"(give 0 for no prompt cache, or at least {page_bytes / GIB:.6f})")
    cache_here = 0 if host_cache else cache
    terms = graph_terms(cfg, tp, storage, context, page_tokens) if graphs else ()
    graph = graph_bytes(terms)
    if kv_budget_bytes is not None:
        budget, room = 0, int(kv_budget_bytes)
    else:
        if budget_bytes is None:
            raise PlanError("no memory budget: give the card size or --kv-gib")
        budget = int(budget_bytes)
        room = budget - wbytes - tower - scratch - reserve - cache_here - graph
        if fit_pages is None:
            _check_room(rank, budget, room, page_bytes, wbytes=wbytes, vision=tower, scratch=scratch, reserve=reserve,
                        cache_here=cache_here, terms=terms)
    pages, fit = _pages(room, page_bytes, fit_pages, host_pages if kv_host else None, kv_pages, rank)
    window, cap = _window(cfg, context, pages * page_tokens)
    if pool_cap and not kv_pages:
        pages = min(pages, parallel * -(-window // page_tokens))
    free = room - pages * page_bytes
    return MemoryPlan(rank=rank, tp=tp, storage=storage.describe(), budget_bytes=budget, weights_bytes=wbytes,
                      scratch_bytes=scratch, state_bytes=state, reserve_bytes=reserve, prompt_cache_bytes=cache,
                      prompt_cache_host=host_cache and cache > 0, page_tokens=page_tokens, page_bytes=page_bytes,
                      bytes_per_token=page_bytes // page_tokens, host_bytes_per_token=host_bpt, fit_pages=fit,
                      num_pages=pages, context=window, window_cap=cap, free_bytes=free,
                      explicit_kv_bytes=int(kv_budget_bytes or 0), host_pages=host_pages, gather_slots=slots,
                      gather_bytes=gather, graph_terms=terms, tail_bytes=tails, vision_bytes=tower,
                      vision_host_bytes=tower_host)


def _check_room(rank: int, budget: int, room: int, page_bytes: int, *, wbytes: int, vision: int, scratch: int,
                reserve: int, cache_here: int, terms: tuple) -> None:
    """Refuse a budget with no room for one KV page, naming what took it (the CUDA graphs when they tipped it)."""
    graph = graph_bytes(terms)
    wbytes_text = f"{_gib(wbytes)}" + (f" + vision {_gib(vision)}" if vision else "")
    cache = f" + prompt cache {_gib(cache_here)}" if cache_here else ""
    if graph and room < page_bytes <= room + graph:
        raise PlanError(f"CUDA graphs do not fit on rank {rank}: they need {_gib(graph)} ({describe(terms)}) "
                        f"but {_gib(room + graph)} are left after weights {wbytes_text} + scratch "
                        f"{_gib(scratch)} + reserve {_gib(reserve)}" + cache
                        + f", and a KV page needs {_size(page_bytes)} more (CUPYGLM_CUDA_GRAPHS=0 runs eagerly)")
    if room < page_bytes:
        raise PlanError(f"no room for KV pages on rank {rank}: weights {wbytes_text} + scratch "
                        f"{_gib(scratch)} + reserve {_gib(reserve)}" + cache
                        + (f" + cuda graphs {_gib(graph)}" if graph else "")
                        + f" exceed the {_gib(budget)} budget (a quantised checkpoint: --quant, --model or "
                        f"--weights-gib in cupyglm-plan)")


def _pages(room: int, page_bytes: int, fit_pages: int | None, host_pages: int | None, kv_pages: int,
           rank: int) -> tuple[int, int]:
    """(pages in the pool, pages that fit): the fit from the room (or the ranks' agreed `fit_pages`), within the
    host pages with --kv-host; --kv-pages past the fit is refused."""
    fit = max(0, room // page_bytes) if fit_pages is None else fit_pages
    if host_pages is not None:
        fit = min(fit, host_pages)
    if fit < 1:
        raise PlanError(f"no room for KV pages on rank {rank} (a page is {_size(page_bytes)})")
    if kv_pages and kv_pages > fit:
        raise PlanError(f"--kv-pages {kv_pages} does not fit: at most {fit:,} pages fit")
    return (kv_pages or fit), fit


def _host_rows(cfg: ModelConfig, storage: Storage, page_tokens: int, context: int, kv_host: bool,
               kv_host_bytes: int | None, host_bpt: int) -> tuple[int, int, int]:
    """--kv-host: (host pages, gather slots, the gather's device bytes); zeros without it. The host pages hold
    `kv_host_bytes` (CUPYGLM_KV_HOST_GIB), one full window unasked (--context, else the model's maximum); the
    slots are the largest window the pages allow, since one segment's gather needs at most its window."""
    if not kv_host:
        return 0, 0, 0
    window = context or cfg.max_position_embeddings
    if kv_host_bytes is None:
        host_pages = -(-window // page_tokens)
    else:
        host_pages = int(kv_host_bytes) // (page_tokens * host_bpt)
        need = -(-(context or 1) // page_tokens)
        if host_pages < need:
            raise PlanError(f"CUPYGLM_KV_HOST_GIB={kv_host_bytes / GIB:g} holds {host_pages} host pages of "
                            f"{page_tokens * host_bpt:,} bytes, fewer than one request's {need} "
                            f"(--context {context or 1:,} tokens)")
    slots = min(context or host_pages * page_tokens, host_pages * page_tokens, cfg.max_position_embeddings)
    gather = total_bytes(gather_arrays(cfg, host_pages * page_tokens, slots), storage)
    return host_pages, slots, gather


def agree(local_fit: int, host_comm) -> int:
    """The pages that fit every rank: the minimum of the ranks' fits (an all-gather)."""
    if host_comm is None or getattr(host_comm, "size", 1) == 1:
        return local_fit
    fits = host_comm.allgather(np.array([local_fit], dtype=np.int64))
    return int(np.min(fits))
