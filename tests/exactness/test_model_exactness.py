"""The output contract on the numpy backend: a row's logits never depend on its batch; prefill = decode."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from cupyglm.model.glm import SeqInput
from model_helpers import bits, build_models, check_batch_invariant, check_prefill_equals_decode, prefill_and_decode


@pytest.fixture(scope="module")
def model(tiny_ckpt):
    return build_models(tiny_ckpt, tp=1, num_pages=96, mtp=True)[0]


prompt = st.lists(st.integers(0, 495), min_size=1, max_size=48)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(target=prompt, others=st.lists(prompt, max_size=3), where=st.integers(0, 3))
def test_row_logits_do_not_depend_on_the_batch(model, target, others, where):
    check_batch_invariant(model, target, others, where % (len(others) + 1))


def test_greedy_batched_equals_alone(model):
    prompts = [[5, 17, 300, 42], list(range(60, 100)), [7] * 13]
    together = prefill_and_decode(model, prompts, 12)
    alone = [prefill_and_decode(model, [p], 12)[0] for p in prompts]
    assert together == alone


@pytest.mark.parametrize("splits", [[1] * 41, [41], [20, 21], [3, 33, 5], [35, 1, 5]])
def test_prefill_equals_decode(model, splits):
    """41 tokens fed in one call, one at a time, or split anywhere: identical state, KV and logits."""
    check_prefill_equals_decode(model, np.random.default_rng(11).integers(0, 496, 41).astype(np.int32), splits)


@pytest.mark.parametrize("tp", [2, 4])
def test_tensor_parallel_shards(tiny_ckpt, tp):
    """TP=N as simulated shards: bit-identical run to run and on every rank, within tolerance of TP=1."""
    from model_helpers import run_ranks

    tokens = np.arange(100, 150, dtype=np.int32)

    def logits(rank, m):
        st = m.new_state()
        out = m.forward([SeqInput(tokens, st, all_logits=True)])[0].logits
        m.release(st)
        return out

    ref = run_ranks(build_models(tiny_ckpt, tp=1), logits)[0]
    models = build_models(tiny_ckpt, tp=tp)
    first = run_ranks(models, logits)
    second = run_ranks(models, logits)
    for r in range(tp):
        assert np.array_equal(bits(first[r]), bits(first[0]))
        assert np.array_equal(bits(second[r]), bits(first[0]))
    # Partials summed per rank change the fp32 order of the split GEMMs, so TP=N is not bit-identical to
    # TP=1; a near-tie in MoE routing can then flip an expert and move a row a lot. Stated tolerance: the
    # median row is within 5% of the logit range and greedy argmax agrees on at least 80% of rows.
    row_diff = np.max(np.abs(first[0] - ref), axis=1)
    scale = np.max(np.abs(ref))
    agree = np.mean(np.argmax(first[0], axis=1) == np.argmax(ref, axis=1))
    print(f"tp={tp}: per-row max |logit - tp1|: median {np.median(row_diff):.4g}, max {row_diff.max():.4g} "
          f"(max |logit| {scale:.3g}); argmax agreement {agree:.0%}")
    assert np.median(row_diff) <= 0.05 * scale
    assert agree >= 0.8
