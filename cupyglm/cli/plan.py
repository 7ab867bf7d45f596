"""cupyglm-plan: the memory plan for any config and card size, without weights.

    cupyglm-plan --config glm-5.3-flash --tp 2 --card-gib 96 [--kv-host] [--context N] [--page-tokens N]
                 [--quant fp8|nvfp4 | --model DIR] [--cuda-graphs] [--no-vision | --vision-host]

Weights: bf16, or a quantised checkpoint's stored bytes (packed values + scales) a rank holds: `--quant` names
the format (the projections the published FP8 release quantises), `--model DIR` reads a checkpoint's config,
quantisation declaration and safetensors headers (no weight is read).

The plan counts every array as `cupyglm.memory` describes it at the backends' storage (--storage to state
another). Rank 0 holds the vision tower when the config has one (--no-vision: not served), or with --vision-host its two
staging slots; the ranks take the fewest pages that fit any of them, as serving ranks agree.
Prints the bytes per token, one plan line per rank (weights, vision, scratch, cuda graphs when on, pages x bytes,
window, prompt cache, reserve, free) and the pages and window; exits 1 with `PlanError: ...` when the plan does not fit.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cupyglm import env
from cupyglm.config import ConfigError, ModelConfig, PRESETS, preset


def _config(name: str) -> ModelConfig:
    if name in PRESETS:
        return preset(name)
    path = Path(name).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ConfigError(f"--config {name}: not a preset ({', '.join(PRESETS)}) nor a config.json")
    return ModelConfig.from_file(path)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cupyglm-plan", description=__doc__.splitlines()[0])
    p.add_argument("--config", default="glm-5.3-flash",
                   help=f"a preset ({', '.join(PRESETS)}), a checkpoint directory or a config.json")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (default 1)")
    p.add_argument("--card-gib", type=float, required=True, help="memory of each rank's card in GiB")
    p.add_argument("--kv-host", action="store_true", help="latent KV rows in host memory (CUPYGLM_KV_HOST=1)")
    p.add_argument("--kv-host-gib", type=float, default=None, help="host memory for the latent rows, GiB")
    p.add_argument("--context", type=int, default=0, help="window in tokens (default 0: the largest that fits)")
    p.add_argument("--page-tokens", type=int, default=0, help="tokens per KV page (default: the model's)")
    p.add_argument("--parallel", type=int, default=4, help="concurrent streams (default 4)")
    p.add_argument("--prefill-chunk", type=int, default=2048, help="rows of the largest step (default 2048)")
    p.add_argument("--prompt-cache-gib", type=float, default=0.0, help="prompt cache in GiB (default 0: none)")
    p.add_argument("--host-cache", action="store_true", help="prompt cache in host memory (CUPYGLM_HOST_CACHE=1)")
    reserve = env.get("CUPYGLM_MEMORY_RESERVE_GIB") or env.VARIABLES["CUPYGLM_MEMORY_RESERVE_GIB"][0]
    p.add_argument("--reserve-gib", type=float, default=float(reserve),
                   help=f"memory kept free per rank (default $CUPYGLM_MEMORY_RESERVE_GIB, {reserve})")
    graphs = env.get_or("CUPYGLM_CUDA_GRAPHS") == "1"
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=graphs,
                   help="decode calls replay CUDA graphs: their KDA seats and pools in the plan (default "
                        f"$CUPYGLM_CUDA_GRAPHS, {'on' if graphs else 'off'})")
    p.add_argument("--vision", action=argparse.BooleanOptionalAction, default=True,
                   help="rank 0 holds the vision tower when the config has one (default on)")
    vhost = env.get_or("CUPYGLM_VISION_HOST") == "1"
    p.add_argument("--vision-host", action=argparse.BooleanOptionalAction, default=vhost,
                   help="the tower's weights in host memory, two staging slots on rank 0's card (default "
                        f"$CUPYGLM_VISION_HOST, {'on' if vhost else 'off'})")
    p.add_argument("--weights-gib", type=float, default=None,
                   help="per-rank weights in GiB (a quantised checkpoint); default: bf16 shard shapes")
    p.add_argument("--quant", choices=("fp8", "nvfp4"), default=None,
                   help="a quantised checkpoint of --config in this format (the FP8 release's projections)")
    p.add_argument("--model", default=None,
                   help="a checkpoint directory: its config and its stored layout (headers only, no weights)")
    p.add_argument("--storage", choices=STORAGE_CHOICES, default="backend",
                   help="how bf16 values are stored: backend (what this install's backends allocate, default), "
                        "bf16 (2 bytes) or fp32 (4 bytes)")
    return p


STORAGE_CHOICES = ("backend", "bf16", "fp32")


def storage(choice: str):
    """The storage the plan counts: the backends' own (read from the numpy backend, which stores as every
    backend does) or a stated one."""
    from cupyglm.memory import BF16_STORAGE, FP32_STORAGE, storage_of

    if choice == "backend":
        from cupyglm.backend.numpy_ops import NumpyOps

        return storage_of(NumpyOps())
    return {"bf16": BF16_STORAGE, "fp32": FP32_STORAGE}[choice]


def main(argv: list[str] | None = None) -> int:
    from cupyglm.engine.plan import GIB, PlanError, kv_bytes_per_token, plan_memory

    from cupyglm.checkpoint import quant

    args = build_parser().parse_args(argv)
    if args.quant and args.model:
        print("cupyglm-plan: --quant and --model are exclusive (a checkpoint states its own format)", file=sys.stderr)
        return 2
    try:
        layout = None
        if args.model:
            from cupyglm.checkpoint.loader import Checkpoint

            ckpt = Checkpoint.open(args.model)
            cfg, layout, args.config = ckpt.config, quant.layout_of(ckpt), args.model
        else:
            cfg = _config(args.config)
            layout = quant.layout_for(cfg, args.quant) if args.quant else None
    except (ConfigError, ValueError) as e:
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        return 2
    st = storage(args.storage)
    bpt = kv_bytes_per_token(cfg, st, args.kv_host)
    where = "pooled keys on the card, latent rows in host memory" if args.kv_host else "device-resident KV"
    weights = "bf16 weights" if layout is None else \
        f"{layout.scheme.fmt} weights ({len(layout.names):,} projections packed + scales)"
    print(f"{args.config}: tp {args.tp}, card {args.card_gib:g} GiB, {st.describe()}, {weights}: {bpt:,} "
          f"bytes/token on the card ({where})")
    kw = dict(storage=st, tp=args.tp, budget_bytes=int(args.card_gib * GIB), parallel=args.parallel,
              context=args.context, page_tokens=args.page_tokens, kv_host=args.kv_host,
              kv_host_bytes=None if args.kv_host_gib is None else int(args.kv_host_gib * GIB),
              reserve_gib=args.reserve_gib, prompt_cache_gib=args.prompt_cache_gib,
              host_cache=args.host_cache, chunk_rows=args.prefill_chunk,
              weights=None if args.weights_gib is None else int(args.weights_gib * GIB),
              quant=layout, graphs=args.cuda_graphs, vision_host=args.vision_host)
    tower = args.vision and cfg.vision is not None
    try:
        fits = [plan_memory(cfg, **{**kw, "context": 0, "kv_pages": 0}, rank=r, vision=tower and r == 0).fit_pages
                for r in range(args.tp)]                       # the ranks agree on the fewest pages
        plans = [plan_memory(cfg, **kw, rank=r, vision=tower and r == 0, fit_pages=min(fits))
                 for r in range(args.tp)]
    except (PlanError, ValueError) as e:
        print(f"PlanError: {e}", file=sys.stderr)
        return 1
    for p in plans:
        print(p.line())
    print(plans[0].summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
