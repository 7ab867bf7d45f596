"""A larger random model of the tiny preset's architecture (about 1B parameters), for speed runs on a GPU: no
checkpoint is written; each tensor is generated once and memoized on disk (bench/random_store.py, keyed by the
config and seed), so later steps and runs read it back, and quantised projections are drawn directly as codes.

    from bench.big_random import big_config, RandomCheckpoint
    ckpt = RandomCheckpoint(big_config())            # duck-types Checkpoint for ModelRunner
    ckpt = RandomCheckpoint(big_config(), quant="nvfp4")   # the FP8 release's projections quantised (fp8 | nvfp4)
    ckpt.build()                                     # every tensor on disk now, in parallel threads
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.random_store import RandomStore  # noqa: E402
from cupyglm.checkpoint import names, quant as qformat  # noqa: E402
from cupyglm.config import DSA, KDA, ModelConfig, preset  # noqa: E402

# ~1.0B parameters (0.96B without the MTP layer): hidden 1024, 16 layers (12 KDA + 4 DSA), 32 experts.
BIG = dict(hidden_size=1024, num_hidden_layers=16, vocab_size=32768, num_attention_heads=16, q_lora_rank=384,
           kv_lora_rank=256, qk_nope_head_dim=64, v_head_dim=64, index_n_heads=8, index_head_dim=64,
           index_topk=256, kda_num_heads=8, kda_head_dim=128, n_routed_experts=32, num_experts_per_tok=4,
           moe_intermediate_size=576, intermediate_size=4096, attn_chunk=256, page_tokens=64, keep_grid=2048)
# The same shape of config at sizes a CPU runs in seconds (gpu-check --dry-run).
SMALL = dict(hidden_size=128, num_hidden_layers=4, vocab_size=1024, num_attention_heads=2, q_lora_rank=64,
             kv_lora_rank=64, qk_nope_head_dim=32, v_head_dim=32, index_n_heads=2, index_head_dim=32,
             index_topk=32, kda_num_heads=2, kda_head_dim=32, n_routed_experts=8, num_experts_per_tok=2,
             moe_intermediate_size=64, intermediate_size=256, attn_chunk=32, page_tokens=16, keep_grid=64)


def big_config(size: str = "big", **overrides) -> ModelConfig:
    """The tiny preset with larger sizes ("big": ~1B parameters; "small": a CPU-sized stand-in)."""
    sizes = {"big": BIG, "small": SMALL}[size] | overrides
    n = sizes["num_hidden_layers"]
    types = tuple(DSA if i % 4 == 3 else KDA for i in range(n))
    tiny = preset("tiny")
    vision = dataclasses.replace(tiny.vision, out_hidden_size=sizes["hidden_size"])    # the merger feeds the text width
    return dataclasses.replace(tiny, layer_types=types, first_k_dense_replace=min(3, n), vision=vision, **sizes)


def param_count(cfg: ModelConfig) -> int:
    return sum(math.prod(s.shape) for s in names.all_specs(cfg))


class _TpShard(Mapping):
    """This rank's block of each tensor of a memoized store, as loader.read_shard cuts it (bf16 only)."""

    def __init__(self, store: Mapping, cfg: ModelConfig, rank: int, tp: int):
        self.store, self.rank, self.tp = store, rank, tp
        self.specs = {s.name: s for s in names.all_specs(cfg)}
        for s in self.specs.values():
            s.shard_shape(tp)                       # raises naming the first tensor that does not split tp ways

    def __getitem__(self, name: str):
        spec, x = self.specs[name], self.store[name]
        if spec.split == "rep":
            return x
        shape, r = spec.shard_shape(self.tp), self.rank
        x = x[r * shape[0]:(r + 1) * shape[0]] if spec.split == "row" else x[:, r * shape[1]:(r + 1) * shape[1]]
        return x.copy(order="C")

    def __iter__(self):
        return iter(self.specs)

    def __len__(self) -> int:
        return len(self.specs)


class RandomCheckpoint:
    """What ModelRunner needs of a Checkpoint (config, shard, path), with random weights (bf16 at any tp the
    sizes split; quantised at tp = 1)."""

    def __init__(self, cfg: ModelConfig, seed: int = 0, quant: str | None = None):
        self.config = cfg
        self.seed = seed
        self.identity = f"random-{cfg.identity()}-{seed}" + (f"-{quant}" if quant else "")
        layout = qformat.layout_for(cfg, quant) if quant else None          # FP8: the published 128 x 128 blocks
        self.scheme = layout.scheme if layout else None
        self.quantised = layout.names if layout else frozenset()

        class _P:
            name = f"random-{param_count(cfg) / 1e9:.2f}B"
        self.path = _P()

        self.store = RandomStore(cfg, seed, self.scheme, self.quantised)

    def build(self, threads: int | None = None) -> int:
        """Every text tensor on disk; returns how many this call generated (0: all memoized)."""
        before = self.store.generated
        self.store.build_all(threads)
        return self.store.generated - before

    def shard(self, rank: int, tp: int):
        if tp == 1:
            return self.store
        if self.quantised:
            raise ValueError("RandomCheckpoint serves a quantised model at tp = 1 only")
        return _TpShard(self.store, self.config, rank, tp)
