"""The MTP head's acceptance on a model: every decode step drafts N (the price off), in-process at TP=1.

    python bench/mtp_acceptance.py [--backend numpy] [--model DIR] [--drafts 3] [--tokens 64]

Runs the bench's code and chat prompts greedy and seeded through an engine with `--mtp-drafts N` and one
without; prints per cell the drafts proposed and accepted, the acceptance rate, tokens per verify call,
replayed rows, wall tok/s drafted vs serial, and whether the tokens are equal (they must be).
"""
from __future__ import annotations

import argparse
import time

from cupyglm.backend import make_ops, resolve
from cupyglm.checkpoint.loader import open_model
from cupyglm.distributed.comm import LocalComm
from cupyglm.engine.config import EngineConfig
from cupyglm.engine.engine import Engine
from cupyglm.engine.runner import ModelRunner
from cupyglm.engine.sampling import SamplingParams
from cupyglm_bench.prompts import chat_prompt, code_prompt


def engine(ckpt, backend, drafts, pages=64, page_tokens=16):
    c = ckpt.config
    runner = ModelRunner(ckpt, make_ops(backend), LocalComm(), pages, page_tokens, mtp=drafts > 0)
    cfg = EngineConfig(context=pages * page_tokens, num_pages=pages, page_tokens=page_tokens, keep_grid=c.keep_grid,
                       parallel=1, eos_token_ids=c.eos_token_ids, vocab_size=c.vocab_size, mtp_drafts=drafts,
                       draft_pricing=False)
    return Engine(runner, LocalComm(), cfg, ckpt.tokenizer)


def one(eng, prompt, params):
    eng.add_request(prompt, params)
    toks, prop, acc, verifies = [], 0, 0, 0
    t0 = time.perf_counter()
    while eng.has_work():
        for o in eng.step():
            toks += o.new_token_ids
            if o.draft and o.draft[0]:
                prop, acc, verifies = prop + o.draft[0], acc + o.draft[1], verifies + 1
    return toks, prop, acc, verifies, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="numpy")
    ap.add_argument("--model", default=None)
    ap.add_argument("--drafts", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    a = ap.parse_args()
    backend = resolve(a.backend)[0]
    ckpt = open_model(a.model)
    tok = ckpt.tokenizer
    cells = [("code", tok.encode(code_prompt(0)[1])), ("chat", tok.encode(chat_prompt(0)[1]))]
    total = [0, 0, 0, 0]
    for name, prompt in cells:
        for temp in (0.0, 0.8):
            sp = SamplingParams(temperature=temp, seed=1, max_tokens=a.tokens, ignore_eos=True)
            d = engine(ckpt, backend, a.drafts)
            got, prop, acc, verifies, t_d = one(d, prompt, sp)
            want, *_, t_s = one(engine(ckpt, backend, 0), prompt, sp)
            per = (acc + verifies) / verifies if verifies else 0.0
            print(f"{name} t={temp:g}: proposed {prop} accepted {acc} rate {acc / max(prop, 1):.3f}; "
                  f"tokens per verify call {per:.3f}; replayed rows {d.verifier.replayed_rows}; "
                  f"tok/s drafted {len(got) / t_d:.2f} serial {len(want) / t_s:.2f} "
                  f"(ratio {t_s / t_d * len(got) / max(len(want), 1):.3f}); equal {got == want}")
            total = [total[0] + prop, total[1] + acc, total[2] + verifies, total[3] + int(got != want)]
    print(f"SUMMARY drafts {a.drafts}: proposed {total[0]} accepted {total[1]} "
          f"rate {total[1] / max(total[0], 1):.4f}; tokens per verify call "
          f"{(total[1] + total[2]) / max(total[2], 1):.3f}; {total[3]} unequal")


if __name__ == "__main__":
    main()
