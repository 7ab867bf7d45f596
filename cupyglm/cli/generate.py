"""cupyglm-generate: greedy generation from one prompt, text streamed to stdout (rank 0).

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
    from cupyglm.backend import make_ops, resolve
    from cupyglm.checkpoint.loader import open_model
    from cupyglm.checkpoint.tokenizer import IncrementalDecoder
    from cupyglm.dist import world as world_mod
    from cupyglm.engine.runner import ModelRunner

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
    page_tokens = st.page_tokens or ckpt.config.page_tokens
    length = len(prompt) + args.max_tokens
    if st.context and length > st.context:
        raise settings_mod.SettingsError(f"prompt ({len(prompt)} tokens) + --max-tokens {args.max_tokens} "
                                         f"exceeds --context {st.context}")
    runner = ModelRunner(ckpt, make_ops(backend), world.comm, -(-length // page_tokens), page_tokens)
    if world.rank == 0:
        print(f"# {note}; tp {world.size}; {len(prompt)} prompt tokens", file=sys.stderr)
    decoder = IncrementalDecoder(tok)
    for t in runner.greedy(prompt, args.max_tokens, stop_ids=set(ckpt.config.eos_token_ids)):
        piece = decoder.push(t)
        if world.rank == 0 and piece:
            sys.stdout.write(piece)
            sys.stdout.flush()
    if world.rank == 0:
        sys.stdout.write(decoder.flush() + "\n")
        sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    from cupyglm.dist.failure import run_rank_main

    # flags are parsed inside the wrapper: a typo on one rank must bring every rank down, not hang them
    return run_rank_main(lambda: generate(build_parser().parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
