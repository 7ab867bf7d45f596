"""The offline API: `LLM(...).generate(prompts, params)` and `.chat(conversations, params)`.

    from cupyglm import LLM, SamplingParams
    llm = LLM()                                   # the built-in tiny checkpoint, on the CPU without a GPU
    for c in llm.generate(["Hello"], SamplingParams(max_tokens=8, temperature=0)):
        print(c.text)

Tensor parallel: run the same script under `mpirun -n N`. Every rank constructs LLM; on ranks other than 0
the constructor runs the engine's worker loop and returns only when rank 0 closes its LLM (`close()`, leaving a
`with` block, or interpreter exit), so their `generate`/`chat` calls return [] and rank 0 alone gets the
completions. Guard printing with `llm.rank == 0`.
"""
from __future__ import annotations

import atexit
import dataclasses
import weakref
from collections.abc import Sequence

from cupyglm.engine.request import QueueFull
from cupyglm.engine.sampling import SamplingParams


@dataclasses.dataclass
class Completion:
    index: int                         # position of the prompt in the call
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None          # "stop" | "length" | "abort"


def _close_at_exit(ref) -> None:
    llm = ref()
    if llm is not None:
        llm.close()


class LLM:
    def __init__(self, model: str | None = None, backend: str = "auto", parallel: int = 4, context: int = 0,
                 page_tokens: int = 0, kv_gib: float | None = None, kv_pages: int = 0, seed: int = 0,
                 max_queue: int = 256, prefill_chunk: int = 0, settings=None, poison: bool = False,
                 log: bool = True):
        """Build Settings (or take `settings`), start the world, plan memory, load this rank's shard and
        build the engine. `prefill_chunk`: prompt tokens per step (a multiple of the keep grid; 0 = default)."""
        from cupyglm.backend import resolve
        from cupyglm.checkpoint.loader import open_model
        from cupyglm.distributed import world as world_mod
        from cupyglm.engine.build import build, log_line
        from cupyglm.settings import Settings

        if settings is None:
            settings = Settings(model=model, backend=backend, parallel=parallel, context=context,
                                page_tokens=page_tokens, kv_gib=kv_gib, kv_pages=kv_pages, seed=seed,
                                max_queue=max_queue, prefill_chunk=prefill_chunk)
        name, note = resolve(settings.backend)
        self.world = world_mod.start(settings, backend=name)
        self.world.settings.refuse_unavailable()
        self.rank = self.world.rank
        say = log_line if log else None
        if say and self.rank == 0:
            say(f"# {note}; tp {self.world.size}")
        self.ckpt = open_model(settings.model)
        self.tokenizer = self.ckpt.tokenizer
        self.engine, self.plan = build(self.world, self.ckpt, poison=poison, log=say)
        self._closed = False
        if self.rank != 0:
            self.engine.worker_loop()
            self._closed = True
        else:
            atexit.register(_close_at_exit, weakref.ref(self))

    # ---- generation --------------------------------------------------------------------------------------------
    def generate(self, prompts: str | Sequence[int] | Sequence[str | Sequence[int]],
                 params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[Completion]:
        """Completions of `prompts` (text or token ids), in order. Ranks other than 0 return []."""
        if self.rank != 0:
            return []
        if self._closed:
            raise RuntimeError("LLM is closed")
        if isinstance(prompts, str) or (prompts and all(isinstance(t, int) for t in prompts)):
            prompts = [prompts]
        prompts = list(prompts)
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        params = list(params)
        if len(params) != len(prompts):
            raise ValueError(f"{len(params)} SamplingParams for {len(prompts)} prompts")
        ids = [self.tokenizer.encode(p) if isinstance(p, str) else [int(t) for t in p] for p in prompts]
        eng = self.engine
        for i, (p, sp) in enumerate(zip(ids, params)):       # refuse before anything runs
            eng.scheduler.resolve_max_tokens(len(p), sp.max_tokens)
        done = [Completion(i, p, [], "", None) for i, p in enumerate(ids)]
        index: dict[int, int] = {}
        todo = list(range(len(ids)))[::-1]
        left = len(ids)
        while left:
            while todo:
                i = todo[-1]
                try:
                    index[eng.add_request(ids[i], params[i])] = i
                except QueueFull:
                    break
                todo.pop()
            for out in eng.step():
                i = index.get(out.request_id)
                if i is None:
                    continue
                c = done[i]
                c.token_ids += out.new_token_ids
                c.text += out.new_text
                if out.finished:
                    c.finish_reason = out.finish_reason
                    del index[out.request_id]
                    left -= 1
        return done

    def chat(self, messages_list, params: SamplingParams | Sequence[SamplingParams] | None = None,
             enable_thinking: bool = False) -> list[Completion]:
        """Completions of conversations (each a list of {"role", "content"}) through the chat template."""
        if self.rank != 0:
            return []
        if messages_list and isinstance(messages_list[0], dict):
            messages_list = [messages_list]
        prompts = [self.tokenizer.encode(self.tokenizer.apply_chat_template(m, enable_thinking=enable_thinking))
                   for m in messages_list]
        return self.generate(prompts, params)

    # ---- lifetime ----------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Rank 0: stop every rank's worker loop. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.engine.shutdown()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
