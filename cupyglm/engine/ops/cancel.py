"""Cancel: requests every rank releases this step (finished, aborted or refused on rank 0).

Apply: the request's state goes (its pages back to this rank's pool, its KDA seat vacated) with any verify
group of it in flight and its image rows.
"""
from __future__ import annotations

import dataclasses

from cupyglm.distributed.step import StepFormatError
from cupyglm.engine.ops.fields import IdList

TAG = 2
NAME = "cancel"
LAYOUT = ("n u32 | n x request_id u64",)


@dataclasses.dataclass(frozen=True)
class Cancel(IdList):
    WHAT = NAME

    request_ids: tuple[int, ...]

    def apply(self, w, result) -> None:
        for rid in self.request_ids:
            if w.requests.pop(rid, None) is None:
                raise StepFormatError(f"step {w.step}: cancels unknown request {rid}")
            state = w.states.pop(rid, None)
            w.images.pop(rid, None)
            w.verifier.drop(rid)
            if state is not None:
                w.runner.release(state)


OP = Cancel
