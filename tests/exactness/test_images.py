"""Image prompts through the engine at TP=1 (in-process, numpy): the tower's rows replace the placeholders'
embeddings (a different image gives different tokens), an image request is bit-identical alone and batched beside
text and image requests (prefilled in one chunk or several), and deterministic (kept states with images:
test_images_cache)."""
import hashlib
import io

import numpy as np
import pytest
from PIL import Image

from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.checkpoint.vision_weights import vision_weights
from cupyglm.distributed.comm import LocalComm
from cupyglm.engine.config import EngineConfig
from cupyglm.engine.engine import Engine
from cupyglm.engine.images import ImageEncoder, ImageInput
from cupyglm.engine.runner import ModelRunner
from cupyglm.engine.sampling import SamplingParams
from cupyglm.vision.processor import ProcessorConfig, process_bytes
from cupyglm.vision.tower import VisionTower
from model_helpers import run_engine


def make_engine(ckpt, parallel=4, prefill_chunk=0, drafts=0, vision_host=False):
    c, ops = ckpt.config, NumpyOps()
    runner = ModelRunner(ckpt, ops, LocalComm(), 96, 16, mtp=drafts > 0)
    cfg = EngineConfig(context=256, num_pages=96, page_tokens=16, keep_grid=c.keep_grid, parallel=parallel,
                       prefill_chunk=prefill_chunk, seed=0, eos_token_ids=c.eos_token_ids, vocab_size=c.vocab_size,
                       mtp_drafts=drafts, draft_pricing=False)
    enc = ImageEncoder(VisionTower(c.vision, vision_weights(ckpt), ops, host=vision_host), ops)
    return Engine(runner, LocalComm(), cfg, ckpt.tokenizer, encoder=enc)


def png(h, w, seed):
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def image_prompt(ckpt, tiny_dir, data, before=30, after=50):
    """(prompt ids, images): text, begin, the placeholders, end, text."""
    v, proc = ckpt.config.vision, ProcessorConfig.from_dir(tiny_dir)
    img = process_bytes(data, proc)
    rng = np.random.default_rng(len(data))
    head, tail = rng.integers(0, 400, before).tolist(), rng.integers(0, 400, after).tolist()
    ids = head + [v.image_start_token_id] + [v.image_token_id] * img.n_tokens + [v.image_end_token_id] + tail
    return ids, (ImageInput(before + 1, img.pixel_values, img.grid, img.n_tokens, hashlib.sha256(data).digest()),)


def run(engine, reqs):
    prompts, params, images = zip(*reqs)
    got, _ = run_engine(engine, list(prompts), list(params), images=list(images))
    assert engine.free_pages == engine.total_pages
    return got


GREEDY = SamplingParams(temperature=0, max_tokens=8)
SEEDED = SamplingParams(temperature=0.9, seed=3, max_tokens=8)


@pytest.fixture(scope="module")
def reqs(tiny_ckpt, tiny_dir):
    a, ai = image_prompt(tiny_ckpt, tiny_dir, png(112, 150, 1))
    b, bi = image_prompt(tiny_ckpt, tiny_dir, png(90, 60, 2), before=5, after=12)
    text = np.random.default_rng(9).integers(0, 400, 70).tolist()
    return [(a, GREEDY, ai), (b, SEEDED, bi), (text, SEEDED, ())]


def test_image_alone_equals_batched_and_chunked(tiny_ckpt, reqs):
    eng = make_engine(tiny_ckpt)
    alone = [run(eng, [r])[0] for r in reqs]
    assert all(len(t) == 8 for t in alone)
    assert run(eng, reqs) == alone
    assert run(make_engine(tiny_ckpt, prefill_chunk=64), reqs) == alone        # images split across chunks
    assert run(eng, reqs) == alone                                             # deterministic


def test_image_tokens_equal_with_the_tower_in_host_memory(tiny_ckpt, reqs):
    resident = run(make_engine(tiny_ckpt), reqs)
    assert run(make_engine(tiny_ckpt, vision_host=True), reqs) == resident


def test_image_drafted_equals_serial(tiny_ckpt, reqs):
    import dataclasses

    eng = make_engine(tiny_ckpt, drafts=3)
    serial = [(p, dataclasses.replace(sp, draft=False), im) for p, sp, im in reqs[:2]]
    assert run(eng, reqs[:2]) == run(eng, serial)


def test_the_image_rows_are_used(tiny_ckpt, tiny_dir, reqs):
    eng = make_engine(tiny_ckpt)
    (ids, sp, im) = reqs[0]
    _, other = image_prompt(tiny_ckpt, tiny_dir, png(112, 150, 7))
    with_rows, other_rows, placeholders = run(eng, [(ids, sp, im), (ids, sp, other), (ids, sp, ())])
    assert with_rows != other_rows and with_rows != placeholders


def test_images_refused_by_name(tiny_ckpt, reqs):
    eng = make_engine(tiny_ckpt)
    ids, sp, im = reqs[0]
    with pytest.raises(ValueError, match="not all image placeholder tokens"):
        eng.add_request([1] + ids[:-1], sp, images=im)
    with pytest.raises(ValueError, match="image placeholder tokens for"):
        eng.add_request(ids + [tiny_ckpt.config.vision.image_token_id], sp, images=im)
    eng.encoder = None
    with pytest.raises(ValueError, match="runs no vision tower"):
        eng.add_request(ids, sp, images=im)
