"""bench/fidelity_hf.py's cupyglm side: one checkpoint on the numpy backend at TP=1, a prompt's every-row logits with
the intermediate values the Hugging Face hooks also record, an image's tower rows put in place of its placeholders
through the model's own image input (SeqInput.embeds, as the engine passes them), and greedy decoding after it."""
from __future__ import annotations

import contextlib

import numpy as np

from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.checkpoint.vision_weights import vision_weights
from cupyglm.distributed.comm import LocalComm
from cupyglm.kv.store import KVStore
from cupyglm.model.glm import GLMModel, SeqInput
from cupyglm.model.moe import MoE
from cupyglm.vision.processor import ProcessorConfig, process_bytes
from cupyglm.vision.tower import VisionTower


class Ours:
    """cupyglm's model (and tower, when the checkpoint has one) over an open checkpoint, numpy backend, TP=1."""

    def __init__(self, ckpt, max_tokens: int):
        cfg = self.cfg = ckpt.config
        self.ops = NumpyOps()
        pages = -(-max_tokens // cfg.page_tokens) + 1
        self.model = GLMModel(cfg, ckpt.shard(0, 1), self.ops, LocalComm(),
                              KVStore(cfg, self.ops, pages, cfg.page_tokens))
        self.tower = VisionTower(cfg.vision, vision_weights(ckpt), self.ops) if cfg.vision else None
        self.processor = ProcessorConfig.from_dir(ckpt.path) if cfg.vision else None
        if self.processor is not None:
            self.processor.check_tower(cfg.vision)

    def image(self, data: bytes):
        """Encoded image bytes -> (pixel_values, grid, n_tokens, the tower's bf16 rows on the host)."""
        if self.tower is None:
            raise ValueError("the checkpoint has no vision tower")
        img = process_bytes(data, self.processor)
        rows = self.ops.asnumpy(self.tower.encode(img.pixel_values, img.grid))
        return img.pixel_values, img.grid, img.n_tokens, rows

    def run(self, ids: list[int], steps: int, image_rows: np.ndarray | None = None):
        """The prompt in one call with every row's logits, then `steps` greedy tokens (the first from the prompt's
        last row) -> (prompt logits [n, V] fp32, {tap: float32 array}, {MoE layer: [n, k] expert ids}, greedy ids)."""
        model, ops = self.model, self.ops
        state = model.new_state()
        try:
            with _recording_routes(ops) as routes:
                logits, taps = self._prefill(np.asarray(ids, np.int32), state, image_rows)
            out = [int(np.argmax(logits[-1]))]
            while len(out) < steps:
                o = model.forward([SeqInput(np.array([out[-1]], np.int32), state, decode=True)])[0]
                out.append(int(np.argmax(ops.asnumpy(o.logits[-1]))))
        finally:
            model.release(state)
        moe = [f"layer{b.layer}" for b in model.blocks if isinstance(b.mlp, MoE)]
        return logits, taps, dict(zip(moe, routes)), out

    def _prefill(self, ids: np.ndarray, state, image_rows):
        """GLMModel.forward_call's steps, the image's rows over its placeholders' embeddings as the engine passes
        them (SeqInput.embeds), and each step's value kept."""
        model, ops, f32 = self.model, self.ops, self._f32
        embeds = ()
        if image_rows is not None:
            at = np.flatnonzero(ids == self.cfg.vision.image_token_id)
            if at.size != image_rows.shape[0] or (at.size and at[-1] - at[0] + 1 != at.size):
                raise ValueError(f"{at.size} image placeholders (one run expected) for {image_rows.shape[0]} rows")
            embeds = ((int(at[0]), image_rows),)
        call = model.begin([SeqInput(ids, state, all_logits=True, embeds=embeds)])
        X, h, post, comb = model.ends_enter(ops.xp.asarray(call.tokens), call.embeds)
        taps = {"embed": f32(X[:, 0])}
        for i, (block, nxt) in enumerate(model.layers()):
            X, h, post, comb = block(X, h, post, comb, call.segs, model.kv, model.comm, nxt)
            taps[f"layer{i}"] = f32(X)
        h, logits = model.ends_exit(X, ops.xp.asarray(call.picked), call.picked_decode)
        taps["norm"] = f32(h)
        model.finish(call, h, logits)
        taps["logits"] = f32(logits)
        return taps["logits"], taps

    def _f32(self, x) -> np.ndarray:
        return np.asarray(self.ops.asnumpy(x), np.float32)


@contextlib.contextmanager
def _recording_routes(ops):
    """Each moe_route call's expert ids [rows, k] on the host, in call order (a prompt call routes each MoE layer
    once, in layer order), while the block runs; the ops object is as before after it."""
    routes, route = [], ops.moe_route

    def recording(logits, *args):
        ids, weights = route(logits, *args)
        routes.append(np.asarray(ops.asnumpy(ids)))
        return ids, weights

    ops.moe_route = recording
    try:
        yield routes
    finally:
        del ops.moe_route
