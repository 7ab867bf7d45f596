"""Admit: the requests every rank learns of this step, their prompts and sampling parameters (sent once; later
operations name a request by its id). Stop strings stay on rank 0, which alone detokenises.

Apply: a fresh state per request (its page table empty until a restore or a lease names its pages).
"""
from __future__ import annotations

import dataclasses
import struct

from cupyglm.distributed.step import Reader, StepFormatError, ids, pack
from cupyglm.engine.ops.fields import COUNT

TAG = 1
NAME = "admit"
LAYOUT = ("n u32 | n x (request_id u64 | n_prompt u32 | temperature f64 | top_p f64 | top_k i32 | min_p f64",
          "| seed u64 | max_tokens u32 | min_tokens u32 | sampling_flags u32 (bit 0 ignore_eos, bit 1 seed given)",
          "| n_stop_ids u32 | prompt ids u32 x n_prompt | stop ids u32 x n_stop_ids)")

_REQUEST = struct.Struct("<QI")
_SAMPLING = struct.Struct("<ddidQIIII")
IGNORE_EOS = 1
HAS_SEED = 2


@dataclasses.dataclass(frozen=True)
class Sampling:
    """A request's sampling parameters as the step message carries them."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0                        # 0 = off
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class NewRequest:
    request_id: int
    prompt: tuple[int, ...]
    sampling: Sampling = Sampling()


@dataclasses.dataclass(frozen=True)
class Admit:
    requests: tuple[NewRequest, ...]

    def encode(self) -> bytes:
        out = bytearray(pack(COUNT, len(self.requests)))
        for req in self.requests:
            s = req.sampling
            flags = (IGNORE_EOS if s.ignore_eos else 0) | (HAS_SEED if s.seed is not None else 0)
            out += pack(_REQUEST, req.request_id, len(req.prompt))
            out += pack(_SAMPLING, float(s.temperature), float(s.top_p), s.top_k, float(s.min_p),
                        0 if s.seed is None else s.seed, s.max_tokens, s.min_tokens, flags, len(s.stop_token_ids))
            out += ids(req.prompt, f"request {req.request_id}'s prompt")
            out += ids(s.stop_token_ids, f"request {req.request_id}'s stop_token_ids")
        return bytes(out)

    @classmethod
    def decode(cls, payload) -> Admit:
        r = Reader(payload, NAME)
        (n,) = r.take(COUNT, "the admit count")
        reqs = []
        for _ in range(n):
            rid, n_prompt = r.take(_REQUEST, "a new request")
            t, p, k, mp, seed, mx, mn, flags, n_stop = r.take(_SAMPLING, f"request {rid}'s sampling")
            prompt = r.ids(n_prompt, f"request {rid}'s prompt")
            stop_ids = r.ids(n_stop, f"request {rid}'s stop_token_ids")
            reqs.append(NewRequest(rid, prompt, Sampling(
                temperature=t, top_p=p, top_k=k, min_p=mp, seed=seed if flags & HAS_SEED else None, max_tokens=mx,
                min_tokens=mn, ignore_eos=bool(flags & IGNORE_EOS), stop_token_ids=stop_ids)))
        r.done()
        return cls(tuple(reqs))

    def apply(self, w, result) -> None:
        for req in self.requests:
            if req.request_id in w.requests:
                raise StepFormatError(f"step {w.step}: request {req.request_id} admitted twice")
            w.requests[req.request_id] = req
            w.states[req.request_id] = w.runner.new_state()


OP = Admit
