"""One rank's model: its checkpoint shard on a backend, its KV store, and forward calls on it."""
from __future__ import annotations

import numpy as np

from cupyglm.checkpoint.loader import Checkpoint
from cupyglm.kv.index_tails import TAIL_SLOTS
from cupyglm.kv.store import KVStore
from cupyglm.model.glm import GLMModel, SeqInput, SeqOutput


class ModelRunner:
    def __init__(self, ckpt: Checkpoint, ops, comm, num_pages: int, page_tokens: int, mtp: bool = False,
                 poison: bool = False, host_slots: int = 0, host_shared=None, graphs: bool = False,
                 tail_slots: int = TAIL_SLOTS, host_writes=None):
        """graphs: decode calls replay CUDA graphs (cuda backend; engine/graph_forward.py chooses per call, the
        model's forward stays eager): every layer whole (a DSA layer's FFN half alone on the host-rows path) and
        the call's ends (embedding in, final norm + lm_head + vocab gather out, and a plain step's sample:
        engine/graph_ends.py); the KV store then holds scratch pages for padding rows. Keyed by (layer, bucket), a
        DSA layer's also by its maps' layout (table width buckets): the captured work has no other host-side shape
        or branch that follows context length or sequences, the KDA states and index tails sit in slots at fixed
        addresses, the DSA maps in a fixed buffer per layout, consecutive captured layers chain their buffers, and
        padding rows are dropped (rows are batch-invariant): engine/graph_capture.py states why a replay is exact
        and what stays eager, engine/kda_slots.py who owns a slot. tail_slots: the sequences alive at once whose
        index tails the KV store holds (kv/index_tails.py; the engine: its running streams). host_writes: an
        observer of the host KV rows each step writes (kv.host_rows.WriteHash; tests)."""
        self.cfg = ckpt.config
        self.ops, self.comm = ops, comm
        self.kv = KVStore(self.cfg, ops, num_pages, page_tokens, poison, host_slots=host_slots,
                          host_shared=host_shared, tail_slots=tail_slots, mtp=mtp, scratch=graphs,
                          host_writes=host_writes)
        self.model = GLMModel(self.cfg, ckpt.shard(comm.rank, comm.size), ops, comm, self.kv, mtp=mtp)
        self.graphs = self.ends = self._graph = None
        if graphs:
            if ops.name != "cuda":
                raise ValueError(f"CUDA graphs need the cuda backend, not {ops.name!r}")
            from cupyglm.engine.graph_forward import GraphForward

            self._graph = GraphForward(self.model, ops, comm)
            self.graphs, self.ends = self._graph.graphs, self._graph.ends     # engine/graph_capture, graph_ends

    def new_state(self):
        return self.model.new_state()

    def release(self, state) -> None:
        """A finished sequence: its pages back, and its KDA seat vacated without a copy (engine/kda_slots.py)."""
        self.model.release(state)
        if self.graphs is not None:
            self.graphs.slots.release(state)

    def forward(self, batch: list[SeqInput], check: bool = True, sample=None) -> list[SeqOutput]:
        """check=False: the caller reads the step's device checks itself, with its one read-back
        (ops.asnumpy_checked), before it uses anything the step computed. sample: rank 0's
        engine/draw.SampleRows, drawn inside the captured exit when the call replays graphs."""
        out = self.model.forward(batch) if self._graph is None else self._graph.forward(batch, sample)
        if check:
            self.ops.raise_device_errors()      # the step's device-side launcher checks, read once
        return out

    def greedy(self, prompt: list[int], max_tokens: int, stop_ids=()):
        """Yield greedy tokens one at a time (argmax, ties to the lower id); frees the pages at the end."""
        state = self.new_state()
        try:
            tokens = np.asarray(prompt, dtype=np.int32)
            for _ in range(max_tokens):
                logits = self.ops.asnumpy(self.forward([SeqInput(tokens, state)])[0].logits[-1])
                tok = int(np.argmax(logits))
                yield tok
                if tok in stop_ids:
                    return
                tokens = np.array([tok], dtype=np.int32)
        finally:
            self.release(state)
