"""cupyglm-generate: greedy generation from one prompt through the engine, text streamed to stdout (rank 0).

    cupyglm-generate [--model DIR] --prompt TEXT [--chat] [--max-tokens N] [--backend numpy]
    mpirun -n 2 cupyglm-generate --prompt TEXT
"""
from __future__ import annotations

import argparse
import sys

from cupyglm import settings as settings_mod


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cupyglm-generate", description=__doc__.splitlines()[0])
    settings_mod.add_arguments(p)
    p.add_argument("--prompt", required=True, help="prompt text")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template (thinking off)")
    p.add_argument("--max-tokens", type=int, default=32, help="tokens to generate (default 32)")
    return p


def generate(args: argparse.Namespace) -> None:
    import dataclasses

    from cupyglm.backend import resolve
    from cupyglm.checkpoint.loader import open_model
    from cupyglm.distributed import world as world_mod
    from cupyglm.engine.build import build
    from cupyglm.engine.sampling import SamplingParams

    if args.max_tokens < 1:
        raise settings_mod.SettingsError("--max-tokens must be at least 1")
    st = settings_mod.Settings.from_args(args)
    backend, note = resolve(st.backend)
    world = world_mod.start(st, backend=backend)           # the fingerprint handshake, before any weight
    world.settings.refuse_unavailable()
    ckpt = open_model(st.model)
    tok = ckpt.tokenizer
    if args.chat:
        text = tok.apply_chat_template([{"role": "user", "content": args.prompt}], enable_thinking=False)
    else:
        text = args.prompt
    prompt = tok.encode(text)
    if not prompt:
        raise settings_mod.SettingsError("--prompt is empty after tokenization")
    length = len(prompt) + args.max_tokens
    if st.context and length > st.context:
        raise settings_mod.SettingsError(f"prompt ({len(prompt)} tokens) + --max-tokens {args.max_tokens} "
                                         f"exceeds --context {st.context}")
    if not (st.context or st.kv_pages or st.kv_gib):      # one prompt: a window of just what it needs
        page = st.page_tokens or ckpt.config.page_tokens
        sized = dataclasses.replace(world.settings, context=-(-length // page) * page, parallel=1)
        world = dataclasses.replace(world, settings=sized)
    engine, _ = build(world, ckpt, log=lambda line: print(f"# {line}", file=sys.stderr, flush=True))
    if world.rank != 0:
        engine.worker_loop()
        return
    print(f"# {note}; tp {world.size}; {len(prompt)} prompt tokens", file=sys.stderr)
    try:
        engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=args.max_tokens,
                                                  skip_special_tokens=False))
        while engine.has_work():
            for out in engine.step():
                if out.new_text:
                    sys.stdout.write(out.new_text)
                    sys.stdout.flush()
        sys.stdout.write("\n")
        sys.stdout.flush()
    finally:
        engine.shutdown()


def main(argv: list[str] | None = None) -> int:
    from cupyglm.distributed.failure import run_rank_main

    # flags are parsed inside the wrapper: a typo on one rank must bring every rank down, not hang them
    return run_rank_main(lambda: generate(build_parser().parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
