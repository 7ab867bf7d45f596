"""Image rows in place of the placeholders' embeddings on the `cuda` backend's code path (the CuPy double):
a prompt chunk holding an image, split over two calls, gives numpy's logits bit for bit."""
from __future__ import annotations

import numpy as np

from cupy_double.fixtures import cuda_double_module  # noqa: F401
from cupyglm.backend.lanes import BF16
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.distributed.comm import LocalComm
from cupyglm.engine.images import chunk_rows
from cupyglm.engine.runner import ModelRunner
from cupyglm.model.glm import SeqInput


def logits(ckpt, ops, tokens, images, cut):
    runner = ModelRunner(ckpt, ops, LocalComm(), 16, 16, poison=True)
    state, out = runner.new_state(), []
    for lo, hi in ((0, cut), (cut, len(tokens))):
        got = runner.forward([SeqInput(np.asarray(tokens[lo:hi], np.int32), state, all_logits=True,
                                       embeds=chunk_rows(images, lo, hi - lo))])
        out.append(np.asarray(ops.asnumpy(got[0].logits), np.float32))
    return np.concatenate(out)


def test_image_rows_on_cuda_equal_numpy(tiny_ckpt, cuda_double_module):
    from cupyglm.backend.cuda_ops import CudaOps

    v, d = tiny_ckpt.config.vision, tiny_ckpt.config.hidden_size
    tokens = [5, 17, v.image_start_token_id] + [v.image_token_id] * 12 + [v.image_end_token_id, 300, 42, 7]
    rows = (np.random.default_rng(0).standard_normal((12, d)) * 0.05).astype(BF16)
    images = ((3, rows),)
    ref, dev = logits(tiny_ckpt, NumpyOps(), tokens, images, 9), logits(tiny_ckpt, CudaOps(), tokens, images, 9)
    plain = logits(tiny_ckpt, NumpyOps(), tokens, (), 9)
    assert np.array_equal(ref.view(np.uint32), dev.view(np.uint32))
    assert not np.array_equal(ref[3:], plain[3:]) and np.array_equal(ref[:3], plain[:3])
