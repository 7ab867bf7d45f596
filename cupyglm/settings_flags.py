"""The shared serve / generate flags (cupyglm.settings.Settings.from_args checks their values, naming the flag)."""
from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The shared serve/generate flags. Values are checked by Settings.from_args, so errors name the flag."""
    g = parser.add_argument_group("model and memory (must agree on every rank)")
    g.add_argument("--model", default=None, metavar="DIR",
                   help="Hugging Face checkpoint directory (default: the built-in tiny checkpoint)")
    g.add_argument("--backend", default=None, metavar="{auto,numpy,sim,cuda}",
                   help="compute backend (default: $CUPYGLM_BACKEND, else auto)")
    g.add_argument("--context", default=None, metavar="TOKENS",
                   help="tokens a sequence may hold (default 0: the largest that fits)")
    g.add_argument("--parallel", default=None, metavar="N", help="concurrent streams (default 4)")
    g.add_argument("--page-tokens", default=None, metavar="N",
                   help="KV page size in tokens, a multiple of 4 (default 0: the model's)")
    g.add_argument("--kv-cache", default=None, metavar="{bf16,fp8}", help="KV cache dtype (default bf16)")
    g.add_argument("--kv-pages", default=None, metavar="N", help="KV pages (default 0: from the memory plan)")
    g.add_argument("--kv-gib", default=None, metavar="GIB", help="KV budget in GiB on CPU backends")
    g.add_argument("--prompt-cache-gib", default=None, metavar="GIB",
                   help="prompt-cache budget in GiB (default 0: no prompt cache)")
    g.add_argument("--prompt-cache-dir", default=None, metavar="DIR",
                   help="kept states evicted from the prompt cache spill to files here and survive a restart "
                        "(each rank its own shard; default: no disk tier)")
    g.add_argument("--prompt-cache-disk-gib", default=None, metavar="GIB",
                   help="disk budget of each rank's spilled states in GiB, LRU (default 16)")
    g.add_argument("--mtp-drafts", default=None, metavar="N", help="MTP draft tokens per step, 0..15 (default 0)")
    g.add_argument("--max-queue", default=None, metavar="N", help="waiting requests before 429 (default 256)")
    g.add_argument("--seed", default=None, metavar="N", help="default sampling seed (default 0)")
    g.add_argument("--prefill-chunk", default=None, metavar="N",
                   help="prompt tokens per step, a multiple of the keep grid (default 0: 512 or the grid above)")
    onoff = argparse.BooleanOptionalAction
    g.add_argument("--vision", action=onoff, default=None,
                   help="serve image parts (default: on when the checkpoint has a vision tower)")
    g.add_argument("--vision-max-images", default=None, metavar="N", help="images one request may hold (default 4)")
    g.add_argument("--vision-image-tokens", default=None, metavar="N",
                   help="most image tokens one image gives: a larger image is resized to fit (default: the "
                        "checkpoint's max_image_tokens)")
    g.add_argument("--vision-urls", action="store_true", default=False,
                   help="fetch remote http(s) image URLs (public addresses only, size and time limits)")
    m = parser.add_argument_group("memory plan (each flag wins over its environment alias)")
    m.add_argument("--host-cache", action=onoff, default=None,
                   help="the prompt-cache arena lives in pinned host memory mapped into the device "
                        "($CUPYGLM_HOST_CACHE)")
    m.add_argument("--kv-share", default=None, metavar="N",
                   help="up to N kept prompts stay in the KV pool as ref-counted pages, needs --prompt-cache-gib > 0 "
                        "(default 0: off; $CUPYGLM_KV_SHARE)")
    m.add_argument("--kv-host", action=onoff, default=None,
                   help="latent KV rows live in pinned host pages mapped into every device ($CUPYGLM_KV_HOST)")
    m.add_argument("--kv-host-shared", action=onoff, default=None,
                   help="ranks of one host map one /dev/shm file for the host KV pages, needs --kv-host "
                        "($CUPYGLM_KV_HOST_SHARED)")
    m.add_argument("--kv-host-gib", default=None, metavar="GIB",
                   help="size of the host KV pages in GiB, needs --kv-host (default one full window; "
                        "$CUPYGLM_KV_HOST_GIB)")
    m.add_argument("--memory-reserve-gib", default=None, metavar="GIB",
                   help="memory each rank keeps free after weights, scratch and KV pages (default 1.0; "
                        "$CUPYGLM_MEMORY_RESERVE_GIB)")
    m.add_argument("--vision-host", action=onoff, default=None,
                   help="rank 0 keeps the vision tower's weights in pinned host memory and stages them to the device "
                        "one unit at a time into two slots ($CUPYGLM_VISION_HOST)")
    m.add_argument("--cuda-graphs", action=onoff, default=None,
                   help="on the cuda backend, decode calls replay CUDA graphs (no bit changes; $CUPYGLM_CUDA_GRAPHS)")
