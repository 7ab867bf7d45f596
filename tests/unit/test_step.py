"""The lockstep message: byte layout round trip (hypothesis), version and magic refusals, delta checks."""
from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cupyglm.distributed import step
from cupyglm.distributed.step import (Mirror, NewRequest, Sampling, ScheduleEntry, StepFormatError, StepMessage,
                               StepVersionError, decode, encode)

u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
tokens = st.lists(u32, max_size=40).map(tuple)
floats = st.floats(allow_nan=False, width=64)

samplings = st.builds(Sampling, temperature=floats, top_p=floats, top_k=st.integers(-2**31, 2**31 - 1),
                      min_p=floats, seed=st.none() | u64, max_tokens=u32, min_tokens=u32, ignore_eos=st.booleans(),
                      stop_token_ids=st.lists(u32, max_size=5).map(tuple))
requests = st.builds(NewRequest, request_id=u64, prompt=tokens, sampling=samplings)
entries = st.builds(ScheduleEntry, request_id=u64, start=u32, count=u32, tokens=st.lists(u32, max_size=4).map(tuple),
                    flags=u32)
kept = st.tuples(u64, u64, u32)
messages = st.builds(StepMessage, step=u64, new=st.lists(requests, max_size=4).map(tuple),
                     cancelled=st.lists(u64, max_size=5).map(tuple), schedule=st.lists(entries, max_size=6).map(tuple),
                     stop=st.booleans(), restores=st.lists(kept, max_size=3).map(tuple),
                     drops=st.lists(u64, max_size=3).map(tuple), keeps=st.lists(kept, max_size=3).map(tuple),
                     evicts=st.lists(u64, max_size=3).map(tuple))


@settings(max_examples=300, deadline=None)
@given(messages)
def test_round_trip(msg):
    blob = encode(msg)
    assert decode(blob) == msg
    assert encode(decode(blob)) == blob


@settings(max_examples=100, deadline=None)
@given(messages, st.data())
def test_truncation_is_refused(msg, data):
    blob = encode(msg)
    cut = data.draw(st.integers(0, len(blob) - 1))
    with pytest.raises(StepFormatError):
        decode(blob[:cut])


def test_layout_sizes_match_docstring():
    assert step._HEADER.size == 28
    assert step._REQUEST.size + step._SAMPLING.size == 12 + 52
    assert step._ENTRY.size == 24
    assert len(encode(StepMessage())) == 28


def test_header_bytes():
    blob = encode(StepMessage(step=5, stop=True))
    assert blob[:4] == b"CGST"
    assert struct.unpack_from("<HHQ", blob, 4) == (step.VERSION, 1, 5)


def test_wrong_version_names_both():
    blob = bytearray(encode(StepMessage(step=1)))
    struct.pack_into("<H", blob, 4, 9)
    with pytest.raises(StepVersionError, match=r"version 9 from rank 0 differs from this rank's version 4"):
        decode(bytes(blob))


def test_evict_section_bytes():
    """The evicts travel first in the prompt-cache section, before the restores (they run before the leases)."""
    blob = encode(StepMessage(step=2, evicts=(7, 3), restores=((1, 9, 64),), drops=(4,)))
    at = step._HEADER.size
    assert struct.unpack_from("<IIII", blob, at) == (2, 1, 1, 0)
    assert struct.unpack_from("<QQ", blob, at + 16) == (7, 3)
    assert struct.unpack_from("<QQI", blob, at + 32) == (1, 9, 64)
    assert decode(blob).evicts == (7, 3) and len(blob) == at + 16 + 16 + 20 + 8


def test_wrong_magic():
    with pytest.raises(StepFormatError, match=r"not a cupyglm step message \(magic b'XXXX', expected b'CGST'\)"):
        decode(b"XXXX" + encode(StepMessage())[4:])
    with pytest.raises(StepFormatError, match="too short"):
        decode(b"CG")


def test_trailing_bytes_and_unknown_flags():
    with pytest.raises(StepFormatError, match="2 trailing bytes"):
        decode(encode(StepMessage()) + b"\0\0")
    blob = bytearray(encode(StepMessage()))
    struct.pack_into("<H", blob, 6, 8)
    with pytest.raises(StepFormatError, match="unknown flags"):
        decode(bytes(blob))


def test_values_out_of_range():
    with pytest.raises(ValueError, match="token id"):
        encode(StepMessage(new=(NewRequest(1, (2**32,)),)))
    with pytest.raises(ValueError, match="token id"):
        encode(StepMessage(new=(NewRequest(1, (-1,)),)))
    with pytest.raises(ValueError, match="does not fit"):
        encode(StepMessage(cancelled=(2**64,)))


def test_numpy_prompt_and_big_prompt():
    prompt = np.arange(200_000, dtype=np.int64)
    msg = StepMessage(new=(NewRequest(3, prompt),))  # type: ignore[arg-type]
    out = decode(encode(msg))
    assert out.new[0].prompt == tuple(range(200_000))


def test_seed_none_vs_zero():
    a = decode(encode(StepMessage(new=(NewRequest(1, (), Sampling(seed=None)),))))
    b = decode(encode(StepMessage(new=(NewRequest(1, (), Sampling(seed=0)),))))
    assert a.new[0].sampling.seed is None and b.new[0].sampling.seed == 0


def test_mirror_deltas():
    m = Mirror()
    m.apply(StepMessage(step=0, new=(NewRequest(1, (5, 6)),), schedule=(ScheduleEntry(1, 0, 2),)))
    m.apply(StepMessage(step=1, schedule=(ScheduleEntry(1, 2, 1, (9,)),)))
    assert m.requests[1].prompt == (5, 6)
    with pytest.raises(StepFormatError, match="out of step"):
        m.apply(StepMessage(step=1))
    with pytest.raises(StepFormatError, match="admitted twice"):
        m.apply(StepMessage(step=2, new=(NewRequest(1, (5,)),)))
    with pytest.raises(StepFormatError, match="schedules unknown request 2"):
        m.apply(StepMessage(step=2, schedule=(ScheduleEntry(2, 0, 1),)))
    with pytest.raises(StepFormatError, match="cancels unknown request 4"):
        m.apply(StepMessage(step=2, cancelled=(4,)))
    with pytest.raises(StepFormatError, match="schedules unknown request 1"):
        m.apply(StepMessage(step=2, cancelled=(1,), schedule=(ScheduleEntry(1, 3, 1),)))
    m.apply(StepMessage(step=2, cancelled=(1,)))
    assert m.requests == {}
