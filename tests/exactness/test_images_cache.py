"""Kept states with images at TP=1 (in-process, numpy): the prompt cache keys an image's placeholders by the image's
digest, so a resumed image conversation restores past the image and equals a fresh engine, in memory, from disk
after a restart, and from a keep point inside the image (the rest of its rows taken); another image behind the
same placeholder ids never matches; an image without a digest is neither kept nor restored."""
import dataclasses

import numpy as np
import pytest

from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.checkpoint.vision_weights import vision_weights
from cupyglm.distributed.comm import LocalComm
from cupyglm.engine.config import EngineConfig
from cupyglm.engine.disk_tier import agree_index, planner_from
from cupyglm.engine.engine import Engine
from cupyglm.engine.images import KEY_BIT, ImageEncoder, ImageInput, cache_tokens, image_tag, request_key
from cupyglm.engine.prompt_cache import MISS_IMAGES
from cupyglm.engine.runner import ModelRunner
from cupyglm.engine.sampling import SamplingParams
from cupyglm.kv import disk_file as df
from cupyglm.kv.disk_store import DiskStore
from cupyglm.kv.kept import KeptStore
from cupyglm.vision.tower import VisionTower
from model_helpers import random_prompt
from test_disk_tier import _fp
from test_images import image_prompt, png

PAGES, PT = 32, 16
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def engine(ckpt, kept_pages=400, directory=None, prefill_chunk=0):
    c, ops = ckpt.config, NumpyOps()
    runner = ModelRunner(ckpt, ops, LocalComm(), PAGES, PT)
    kept = disk = planner = None
    if kept_pages:
        probe = KeptStore(c, ops, runner.kv, 1, 1 << 30)
        kept = KeptStore(c, ops, runner.kv, 1, kept_pages * probe.page_bytes)
    if directory is not None:
        disk = DiskStore(directory, _fp(), kept, 0, 1, lambda line: None)
        disk.index()
        agree_index(disk, None)
        planner = planner_from(disk, 1 << 30, kept.state_bytes)
    cfg = EngineConfig(context=PAGES * PT, num_pages=PAGES, page_tokens=PT, keep_grid=c.keep_grid, parallel=2,
                       prefill_chunk=prefill_chunk, seed=0, eos_token_ids=c.eos_token_ids, vocab_size=c.vocab_size)
    enc = ImageEncoder(VisionTower(c.vision, vision_weights(ckpt), ops), ops)
    return Engine(runner, LocalComm(), cfg, None, kept=kept, disk=disk, planner=planner, encoder=enc)


def run(eng, ids, images):
    """(tokens, cached_tokens, miss reason) of one request."""
    rid = eng.add_request(ids, GREEDY, images=images)
    toks, last = [], None
    while eng.has_work():
        for out in eng.step():
            if out.request_id == rid:
                toks += out.new_token_ids
                last = out
    return toks, last.cached_tokens, last.cache_miss_reason


@pytest.fixture(scope="module")
def turns(tiny_ckpt, tiny_dir):
    """(first turn's ids, its images, the image's end, another image over the same placeholders)."""
    ids, ims = image_prompt(tiny_ckpt, tiny_dir, png(112, 150, 1))
    _, other = image_prompt(tiny_ckpt, tiny_dir, png(112, 150, 7))
    assert other[0].n_tokens == ims[0].n_tokens and other[0].digest != ims[0].digest
    return ids, ims, ims[0].end, other


def follow_up(eng, ids, ims):
    """The second turn: the first turn, its reply, more text."""
    reply, _, _ = run(eng, ids, ims)
    return ids + reply + random_prompt(9, seed=4)


@pytest.mark.parametrize("same", [True, False], ids=["same-image", "other-image"])
def test_a_resumed_image_turn_restores_only_behind_its_own_image(tiny_ckpt, turns, same):
    """The same image resumes past it; another image over the same placeholders misses there; both equal fresh."""
    ids, ims, end, other = turns
    eng = engine(tiny_ckpt)
    nxt = follow_up(eng, ids, ims)
    images = ims if same else other
    got, cached, miss = run(eng, nxt, images)
    fresh, fresh_cached, _ = run(engine(tiny_ckpt, kept_pages=0), nxt, images)
    assert got == fresh and fresh_cached == 0
    assert (cached >= end and miss is None) if same else cached <= ims[0].start


def test_a_keep_point_inside_the_image_resumes_with_the_rest_of_its_rows(tiny_ckpt, tiny_dir):
    grid = tiny_ckpt.config.keep_grid
    ids, ims = image_prompt(tiny_ckpt, tiny_dir, png(112, 150, 1), before=grid - 14)
    assert ims[0].start < grid < ims[0].end                  # the first chunk ends inside the image
    eng = engine(tiny_ckpt, prefill_chunk=grid)
    run(eng, ids, ims)
    other = ids[:ims[0].end + 1] + random_prompt(40, seed=5)  # the same image, then other text
    got, cached, _ = run(eng, other, ims)
    assert cached == grid and got == run(engine(tiny_ckpt, kept_pages=0), other, ims)[0]


def test_an_image_without_a_digest_is_not_kept(tiny_ckpt, turns):
    ids, ims, _, _ = turns
    bare = (dataclasses.replace(ims[0], digest=b""),)
    eng = engine(tiny_ckpt)
    first, _, miss = run(eng, ids, bare)
    assert miss == MISS_IMAGES and eng.cache_held[0] == 0
    assert run(eng, ids, bare) == (first, 0, MISS_IMAGES)


def test_image_states_on_disk_restore_after_a_restart(tiny_ckpt, turns, tmp_path):
    ids, ims, end, other = turns
    eng = engine(tiny_ckpt, directory=tmp_path)
    nxt = follow_up(eng, ids, ims)
    eng.shutdown()                                           # the stop saves the kept state
    (f,) = [p for p in tmp_path.iterdir() if p.suffix == df.SUFFIX]
    header = df.read_header(f, _fp())
    assert list(header.tokens) == list(request_key(ids, ims))
    cold = engine(tiny_ckpt, kept_pages=0)
    assert run(engine(tiny_ckpt, directory=tmp_path), nxt, ims)[:2] == (run(cold, nxt, ims)[0], len(ids))
    got, cached, _ = run(engine(tiny_ckpt, directory=tmp_path), nxt, other)
    assert cached <= ims[0].start and got == run(cold, nxt, other)[0]


def test_cache_tokens_name_the_image_and_its_grid():
    pix = np.zeros((4, 8), np.float32)
    a = ImageInput(2, pix, (1, 2, 2), 3, b"a" * 32)
    prompt = [5, 6, 9, 9, 9, 7]
    key = request_key(prompt, (a,))
    assert key[:2] == (5, 6) and key[5:] == (7,) and all(k >= KEY_BIT for k in key[2:5])
    assert len(set(key[2:5])) == 3 and key == request_key(prompt, (a,))
    assert request_key(prompt, (dataclasses.replace(a, digest=b"b" * 32),))[2:5] != key[2:5]
    assert request_key(prompt, (dataclasses.replace(a, grid=(1, 4, 1)),))[2:5] != key[2:5]
    assert request_key(prompt, (dataclasses.replace(a, digest=b""),)) is None
    assert cache_tokens(prompt, ()) == tuple(prompt) and len(image_tag(a)) == 32
