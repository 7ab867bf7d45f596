"""Sampling: greedy ties, the counter-based RNG, the fp32 algorithm against a direct reference, stops, validation."""
import numpy as np
import pytest

from cupyglm.backend.numpy_sample import rng_bits, splitmix64, uniform
from cupyglm.engine.sampling import SamplingParams, banned_ids, find_stop, holdback, sample, token_finish

EOS = (10, 11)


def _logits(seed, v=64, scale=3.0):
    return (np.random.default_rng(seed).standard_normal(v) * scale).astype(np.float32)


def test_splitmix64_known_values():
    # splitmix64 of 0 (Vigna's reference sequence with state 0: first output)
    assert splitmix64(0) == 0xE220A8397B1DCDAF
    assert rng_bits(0, 0) == splitmix64(splitmix64(0))
    u = uniform(123, 45)
    assert u.dtype == np.float32 and 0 <= u < 1
    assert float(u) * 2**24 == int(float(u) * 2**24)        # 24 bits, exact


def test_greedy_ties_go_to_the_lower_id():
    x = np.zeros(16, np.float32)
    x[[3, 7, 12]] = 5.0
    assert sample(x, SamplingParams(temperature=0), 0, 0) == 3
    x[3] = 4.0
    assert sample(x, SamplingParams(temperature=0), 0, 0) == 7


def test_same_seed_and_position_same_token_regardless_of_batch():
    p = SamplingParams(temperature=0.9, top_p=0.95)
    x = _logits(1)
    alone = [sample(x, p, 42, pos) for pos in range(50)]
    # The draw is a pure function of (logits, params, seed, position): interleave other rows, other seeds.
    mixed = []
    for pos in range(50):
        sample(_logits(pos + 100), p, 7, pos)
        mixed.append(sample(x, p, 42, pos))
    assert alone == mixed
    assert len(set(alone)) > 3                                 # it does vary with the position


def test_different_seeds_differ():
    p = SamplingParams(temperature=1.0)
    x = _logits(2, scale=0.5)
    a = [sample(x, p, 1, pos) for pos in range(40)]
    b = [sample(x, p, 2, pos) for pos in range(40)]
    assert a != b


def test_top_k_1_equals_greedy():
    for s in range(20):
        x = _logits(s)
        assert sample(x, SamplingParams(temperature=1.3, top_k=1), s, s) == int(np.argmax(x))
    x = np.zeros(8, np.float32)                                # ties at the cut: the lower id
    assert sample(x, SamplingParams(temperature=1.0, top_k=1), 5, 5) == 0


def _reference(x, p: SamplingParams, seed, pos):
    """A direct, loop-by-loop reading of the module docstring."""
    x = x.astype(np.float32) / np.float32(p.temperature)
    ids = sorted(range(len(x)), key=lambda i: (-x[i], i))
    if p.top_k > 0:
        ids = ids[:p.top_k]
    s = [x[i] for i in ids]
    e = [np.float32(np.exp(np.float32(v - s[0]))) for v in s]
    tot = np.float32(0)
    for v in e:
        tot = np.float32(tot + v)
    probs = [np.float32(v / tot) for v in e]
    keep = len(ids)
    if p.top_p < 1:
        c, keep = np.float32(0), 1
        for i in range(1, len(ids)):
            c = np.float32(c + probs[i - 1])
            if c < np.float32(p.top_p):
                keep = i + 1
            else:
                break
    if p.min_p > 0:
        thr = np.float32(p.min_p) * probs[0]
        keep = min(keep, max(1, sum(1 for q in probs[:keep] if q >= thr)))
    cum, q = [], np.float32(0)
    for v in probs[:keep]:
        q = np.float32(q + v)
        cum.append(q)
    r = np.float32(uniform(seed, pos) * cum[-1])
    for i, c in enumerate(cum):
        if c > r:
            return ids[i]
    return ids[keep - 1]


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.7),
    SamplingParams(temperature=1.0, top_p=0.5),
    SamplingParams(temperature=1.2, top_k=5),
    SamplingParams(temperature=0.8, min_p=0.2),
    SamplingParams(temperature=1.5, top_k=20, top_p=0.8, min_p=0.05),
])
def test_algorithm_matches_a_direct_reference(params):
    for s in range(30):
        x = _logits(s, v=48)
        assert sample(x, params, s * 7, s) == _reference(x, params, s * 7, s)


def test_filters_keep_only_allowed_tokens():
    x = np.array([5.0, 4.9, 1.0, 0.0, -1.0, -3.0], np.float32)
    # min_p 0.5: p1/p0 = e^-0.1 passes, p2/p0 = e^-4 fails -> only 0 and 1 are ever drawn
    draws = {sample(x, SamplingParams(min_p=0.5), 3, pos) for pos in range(200)}
    assert draws == {0, 1}
    # top_p 0.5: the first token alone holds ~0.51 of the mass
    draws = {sample(x, SamplingParams(top_p=0.5), 3, pos) for pos in range(200)}
    assert draws == {0}


def test_min_tokens_suppresses_eos_and_stop_ids():
    x = np.zeros(16, np.float32)
    x[10] = 50.0                    # EOS overwhelmingly likely
    x[4] = 49.0                     # a stop id
    p = SamplingParams(temperature=0, min_tokens=2, stop_token_ids=(4,))
    assert set(banned_ids(p, 0, EOS)) == {4, 10, 11}
    assert sample(x, p, 0, 0, n_generated=0, eos_ids=EOS) not in (4, 10, 11)
    assert sample(x, p, 0, 0, n_generated=2, eos_ids=EOS) == 10
    ign = SamplingParams(temperature=0, min_tokens=2, ignore_eos=True)
    assert banned_ids(ign, 0, EOS) == []
    # token_finish: a stop/EOS token is honoured only after min_tokens tokens
    assert token_finish(p, 10, 2, 100, EOS) is None
    assert token_finish(p, 10, 3, 100, EOS) == "stop"
    assert token_finish(p, 4, 3, 100, EOS) == "stop"
    assert token_finish(ign, 10, 3, 100, EOS) is None
    assert token_finish(p, 7, 100, 100, EOS) == "length"
    assert token_finish(p, 10, 100, 100, EOS) == "stop"


def test_stop_strings_cut_the_text():
    assert find_stop("hello world", ["wor"]) == 6
    assert find_stop("hello world", ["xyz", "lo", "o w"]) == 3
    assert find_stop("abcdef", ["cd"], start=3) == 2            # a match straddling the previous end
    assert find_stop("abcdef", ["ab"], start=5) == -1
    assert holdback(["abc", "z"]) == 2 and holdback([]) == 0


@pytest.mark.parametrize("field,kwargs", [
    ("temperature", {"temperature": -0.1}),
    ("top_p", {"top_p": 0.0}),
    ("top_p", {"top_p": 1.5}),
    ("top_k", {"top_k": -2}),
    ("min_p", {"min_p": 1.1}),
    ("seed", {"seed": -1}),
    ("max_tokens", {"max_tokens": 0}),
    ("min_tokens", {"min_tokens": -1}),
    ("min_tokens", {"min_tokens": 5, "max_tokens": 4}),
    ("stop", {"stop": [""]}),
    ("stop_token_ids", {"stop_token_ids": [-3]}),
    ("temperature", {"temperature": float("nan")}),
    ("ignore_eos", {"ignore_eos": 1}),
])
def test_validation_names_the_field(field, kwargs):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_defaults_and_normalisation():
    p = SamplingParams(stop="END", stop_token_ids=[3, 4], top_k=-1)
    assert p.temperature == 1.0 and p.top_p == 1.0 and p.max_tokens == 16 and p.min_p == 0.0
    assert p.stop == ("END",) and p.stop_token_ids == (3, 4) and p.top_k == 0
    assert SamplingParams(temperature=0).greedy and not SamplingParams().greedy


def test_nan_logits_are_refused():
    x = np.zeros(8, np.float32)
    x[2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        sample(x, SamplingParams(temperature=0), 0, 0)
