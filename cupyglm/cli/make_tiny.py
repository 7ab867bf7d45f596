"""cupyglm-make-tiny DIR [--seed N] [--quant fp8|nvfp4]: write the deterministic tiny checkpoint into DIR."""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="cupyglm-make-tiny",
        description="Write a deterministic random checkpoint of the GLM-5.3-Flash architecture at tiny sizes, "
                    "laid out as the published checkpoint (config.json with text_config and vision_config, "
                    "safetensors shards under the real tensor names and dtypes, a tiny vision tower's tensors, "
                    "byte-level BPE tokenizer with the image tokens, GLM chat template, "
                    "preprocessor_config.json).")
    parser.add_argument("dir", help="output directory (created if missing; its checkpoint files are overwritten)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0); same seed, same bytes")
    parser.add_argument("--quant", choices=("fp8", "nvfp4"), default=None,
                        help="store the projections the FP8 release quantises as FP8 block-scaled (32x32 blocks) "
                             "or NVFP4 (ModelOpt layout); the same values as the bf16 tiny otherwise")
    args = parser.parse_args(argv)
    if args.seed < 0:
        parser.error("--seed must be non-negative")

    from cupyglm.checkpoint.loader import Checkpoint
    from cupyglm.checkpoint.tiny import write_tiny

    out = write_tiny(args.dir, seed=args.seed, quant=args.quant)
    ckpt = Checkpoint.open(out)
    vision = sum(1 for s in ckpt.table.values() if s.part == "vision")
    mib = ckpt.nbytes() / 2**20
    print(f"wrote {out}: {len(ckpt.table)} tensors ({vision} of the vision tower), {mib:.1f} MiB of text weights, "
          f"vocab {ckpt.tokenizer.vocab_size}, seed {args.seed}, identity {ckpt.identity}"
          + (f", {len(ckpt.quantised)} projections {args.quant}" if args.quant else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
