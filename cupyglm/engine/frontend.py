"""Rank 0's front end: requests in (`add`, `abort`), a step's sampled tokens out as RequestOutputs, one record a
request (`cupyglm.engine.record`) and one way to end it.

What must stay true:
- A request is live from `add` to `end`: its record is in `records` exactly as long as its Request is in the
  scheduler's `requests` (at every boundary of the engine's lock). `end(record, reason)` is the only place a
  request ends on rank 0, whatever the reason: finished (length, stop id, EOS, stop string), aborted, refused
  (FINISH_ERROR, e.g. its KV rows ran past the host cache's slots) or failed (its grammar; ended "abort"). It
  lets the scheduler release the pages (a no-op when the scheduler already ended it) and drops the record, so
  nothing of the request is left on rank 0; the other ranks learn it from the next step's `cancelled`.
- Outputs keep their order: aborts made between steps, then the step's refusals, then its deltas, then the
  aborts (and failed grammars) that arrived while it ran.

The engine calls every method here under its lock; `add` validates before it takes anything.
"""
from __future__ import annotations

import itertools

from cupyglm.engine.grammar import Guides
from cupyglm.engine.images import check_images, request_key
from cupyglm.engine.outputs import step_outputs
from cupyglm.engine.record import Matchers, Record
from cupyglm.engine.request import Request, RequestOutput
from cupyglm.engine.sampling import FINISH_ABORT, SamplingParams
from cupyglm.engine.text import RequestText

FINISH_ERROR = "error"          # rank 0 refused a running request (RequestOutput.error names why)


class Frontend:
    """Rank 0's live requests (request id -> Record) over the scheduler."""

    def __init__(self, scheduler, cfg, tokenizer, vocab: int):
        self.scheduler, self.cfg, self.tokenizer = scheduler, cfg, tokenizer
        self.records: dict[int, Record] = {}
        self.guides = Guides(tokenizer, vocab, cfg.eos_token_ids, matchers=Matchers(self.records))
        self.ready: list[RequestOutput] = []        # ended requests' outputs waiting for the next step's
        self.later: list[int] = []                  # aborts that arrived while a step ran, applied after it
        self._ids = itertools.count()
        self._seeds = itertools.count()

    # ---- requests in -------------------------------------------------------------------------------------------
    def add(self, prompt_ids, params: SamplingParams | None, request_id: int | None, cache_salt: str | None,
            images=(), image_token_id: int | None = None) -> int:
        """Queue a request; its id. QueueFull, RequestTooLong or ValueError before anything is kept or a seed used."""
        params = params or SamplingParams()
        prompt = tuple(int(t) for t in prompt_ids)
        vocab = self.cfg.vocab_size
        if vocab and any(not 0 <= t < vocab for t in prompt):
            bad = next(t for t in prompt if not 0 <= t < vocab)
            raise ValueError(f"prompt token id {bad} is outside the vocabulary (0..{vocab - 1})")
        images = check_images(prompt, images, image_token_id)
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer")
        if request_id is None:
            request_id = next(self._ids)
            while request_id in self.records:
                request_id = next(self._ids)
        elif not 0 <= int(request_id) < 2**64:
            raise ValueError(f"request_id must be in 0..2**64-1, got {request_id}")
        max_tokens = self.scheduler.resolve_max_tokens(len(prompt), params.max_tokens)
        req = Request(int(request_id), prompt, params, max_tokens, salt=cache_salt or "", images=images,
                      image_key=request_key(prompt, images) if images else None)
        matcher = None if params.guide is None else self.guides.compile(params.guide)   # ValueError first
        self.scheduler.add(req)                       # QueueFull / duplicate id raise before a seed is used
        seed = params.seed if params.seed is not None else (self.cfg.seed + next(self._seeds)) % 2**64
        self.records[req.id] = Record(req, seed, RequestText(self.tokenizer, params), matcher)
        return req.id

    def seeds(self, request_ids) -> dict[int, int]:
        """The seeds of these live requests (the step message admits them with it; rank 0 samples with it)."""
        return {rid: self.records[rid].seed for rid in request_ids}

    def abort(self, request_id: int, later: bool) -> bool:
        """Cancel a live request (`later`: a step is running, so after it); False when it is not live."""
        if request_id not in self.records:
            return False
        if later:
            self.later.append(request_id)
        else:
            self.ready.append(self._ended(self.records[request_id], FINISH_ABORT))
        return True

    def fail(self, request_ids: list[int]) -> None:
        """Requests whose grammar failed this step: ended "abort" with the aborts that arrived while it ran."""
        self.later += request_ids

    def run_aborts(self) -> None:
        for rid in self.later:
            rec = self.records.get(rid)
            if rec is not None:                       # an id aborted twice ends once
                self.ready.append(self._ended(rec, FINISH_ABORT))
        self.later.clear()

    def has_ready(self) -> bool:
        return bool(self.ready or self.later)

    def take_ready(self) -> list[RequestOutput]:
        ready, self.ready = self.ready, []
        return ready

    # ---- a step's results --------------------------------------------------------------------------------------
    def add_prompt_logprobs(self, got: dict[int, list]) -> None:
        for rid, entries in got.items():
            self.records[rid].add_prompt_logprobs(entries)

    def finish_step(self, plan, sampled: dict, logprobs: dict, refused: dict[int, str],
                    ready: list[RequestOutput]) -> list[RequestOutput]:
        """The step's outputs after its model call: aborts, refusals, then the scheduler's update and the deltas."""
        self.run_aborts()
        for rid, why in refused.items():
            rec = self.records.get(rid)
            if rec is not None:
                ready.append(self._ended(rec, FINISH_ERROR, why))
        events = self.scheduler.update(plan, sampled)
        stepped = []
        for g in plan.groups:                         # one group a request
            rec = self.records.get(g.request_id)
            if rec is None:
                continue
            stepped.append(rec)
            rec.logprobs = list(logprobs.get(g.request_id, ()))
            if g.drafts and g.request_id in sampled:
                rec.drafts = (g.drafts, len(sampled[g.request_id]) - 1)
        outputs = ready + step_outputs(events, self.records, self.end, self.cfg.mtp_drafts > 0)
        for rec in stepped:
            rec.clear_step()
        outputs, self.ready = outputs + self.ready, []
        return outputs

    # ---- the one end -------------------------------------------------------------------------------------------
    def end(self, rec: Record, reason: str) -> None:
        """End a request for any reason: its pages go back at once (unless the scheduler already ended it on a
        token) and its record goes, with its text, grammar matcher and logprobs."""
        self.scheduler.finish(rec.id, reason)
        rec.req.finish_reason = reason
        self.records.pop(rec.id, None)

    def end_all(self) -> None:
        """Abort every live request (shutdown): no outputs."""
        for rec in list(self.records.values()):
            self.end(rec, FINISH_ABORT)

    def _ended(self, rec: Record, reason: str, error: str | None = None) -> RequestOutput:
        """End a request that takes no token this step; its last output."""
        self.end(rec, reason)
        r = rec.req
        return RequestOutput(r.id, [], "", True, reason, r.prompt_len, len(r.output), r.cached,
                             None if r.cached else r.miss_reason, error=error)
