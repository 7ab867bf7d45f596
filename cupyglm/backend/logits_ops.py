"""The ops of the `numpy` backend on a step's fp32 logits rows, rank 0's sampler side: penalties, the grammar
mask, the draw and the logprobs. NumpyOps inherits them; SimOps and CudaOps replace each with its kernel."""
from __future__ import annotations

import numpy as np

from cupyglm.backend.numpy_logprobs import logprobs_rows
from cupyglm.backend.numpy_penalties import penalize_rows
from cupyglm.backend.numpy_sample import sample_rows
from cupyglm.backend.numpy_token_mask import mask_rows


class LogitsOps:
    """Edits in place (penalize, mask_tokens) in the engine's order, then the draw and logprobs of the same rows."""

    def sample(self, logits: np.ndarray, temperature: np.ndarray, top_k: np.ndarray, top_p: np.ndarray,
               min_p: np.ndarray, seed: np.ndarray, position: np.ndarray) -> np.ndarray:
        """One token per row: numpy_sample.draw (the one definition) on each row of logits [R, V]
        fp32. temperature [R] f32 (< 1e-5: greedy, the lowest id among the maxima), top_k [R] i32 (0 = off),
        top_p [R] f32, min_p [R] f32, seed [R] u64, position [R] i32 (the drawn token's position: the RNG's
        counter) -> tokens [R] int32, -1 for a row holding NaN. Bans (min_tokens) are logits edits made by the
        caller before the op."""
        return sample_rows(logits, temperature, top_k, top_p, min_p, seed, position)

    def logprobs(self, logits: np.ndarray, tokens: np.ndarray, top: int) -> np.ndarray:
        """The sampled tokens' logprobs and each row's `top` best (numpy_logprobs.logprobs_rows): logits
        [R, V] f32 (what `sample` drew from), tokens [R] i32 -> [R, 2 + 2 top] int32 packed, one transfer."""
        return logprobs_rows(logits, tokens, int(top))

    def penalize(self, logits: np.ndarray, row, id, count, seen, bias, repetition, frequency, presence) -> None:
        """Penalties and logit_bias edited into logits [R, V] f32 in place (numpy_penalties): row/id/count/
        seen [N] i32 and bias [N] f32, one per distinct (row, id); repetition/frequency/presence [R'] f32."""
        penalize_rows(logits, row, id, count, seen, bias, repetition, frequency, presence)

    def mask_tokens(self, logits: np.ndarray, row, bits) -> None:
        """-inf where a grammar forbids the id (numpy_token_mask): rows row [M] i32, bits [M, W] i32."""
        mask_rows(logits, row, bits)
