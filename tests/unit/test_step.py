"""The step message: round trip of every operation (hypothesis), the frame's refusals, the operations' order,
the docs' layout table against the codec, and the worker's delta checks."""
from __future__ import annotations

import re
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cupyglm.distributed import step as frame
from cupyglm.distributed.step import StepFormatError, StepVersionError
from cupyglm.engine.disk_tier import DISK_CLEAR, DISK_SYNC, DiskOps
from cupyglm.engine.ops.admit import NewRequest, Sampling
from cupyglm.engine.ops.cancel import Cancel
from cupyglm.engine.ops.codec import StepMessage, decode, encode, layout
from cupyglm.engine.ops.evict import Evict
from cupyglm.engine.ops.run import Group
from cupyglm.engine.step_message import assemble
from cupyglm.engine.worker import Worker
from cupyglm.kv.pool import PagePool
from cupyglm.kv.state import SeqState

u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
tokens = st.lists(u32, max_size=40).map(tuple)
floats = st.floats(allow_nan=False, width=64)
d16 = st.binary(min_size=16, max_size=16)

samplings = st.builds(Sampling, temperature=floats, top_p=floats, top_k=st.integers(-2**31, 2**31 - 1),
                      min_p=floats, seed=st.none() | u64, max_tokens=u32, min_tokens=u32, ignore_eos=st.booleans(),
                      stop_token_ids=st.lists(u32, max_size=5).map(tuple))
requests = st.builds(NewRequest, request_id=u64, prompt=tokens, sampling=samplings)
groups = st.builds(Group, request_id=u64, start=u32, count=u32, tokens=st.lists(u32, max_size=4).map(tuple),
                   flags=st.integers(0, 15))
kept = st.tuples(u64, u64, u32)
small = dict(max_size=3)
disks = st.builds(DiskOps, spills=st.lists(st.tuples(u64, d16, d16), **small).map(tuple),
                  loads=st.lists(st.tuples(u64, u32, d16), **small).map(tuple),
                  unlinks=st.lists(d16, **small).map(tuple), ops=st.integers(0, 3))
messages = st.builds(
    assemble, step=u64, stop=st.booleans(), new=st.lists(requests, max_size=4), cancelled=st.lists(u64, max_size=5),
    settles=st.lists(st.tuples(u64, u32), **small), evicts=st.lists(u64, **small),
    restores=st.lists(st.tuples(u64, u64, u32, tokens), **small), leases=st.lists(st.tuples(u64, tokens), **small),
    groups=st.lists(groups, max_size=6), drops=st.lists(u64, **small), keeps=st.lists(kept, **small),
    disk=st.none() | disks)


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


def test_header_bytes():
    assert frame.HEADER.size == 20 and frame.RECORD.size == 6
    blob = encode(StepMessage(step=5, stop=True))
    assert blob[:4] == b"CGST" and len(blob) == 20
    assert struct.unpack_from("<HHQI", blob, 4) == (frame.VERSION, 1, 5, 0)


def test_operation_bytes():
    """An evict is tag 4, its payload a count and the entries."""
    blob = encode(StepMessage(step=2, ops=(Evict((7, 3)),)))
    assert struct.unpack_from("<HI", blob, 20) == (4, 4 + 16)
    assert struct.unpack_from("<IQQ", blob, 26) == (2, 7, 3) and len(blob) == 26 + 20


def test_order_is_the_codec_s():
    with pytest.raises(StepFormatError, match="out of order"):
        encode(StepMessage(step=1, ops=(Evict((1,)), Cancel((2,)))))
    with pytest.raises(StepFormatError, match="out of order or repeated"):
        encode(StepMessage(step=1, ops=(Cancel((1,)), Cancel((2,)))))
    blob = bytearray(encode(StepMessage(step=1, ops=(Cancel((2,)),))))
    struct.pack_into("<H", blob, 20, 99)
    with pytest.raises(StepFormatError, match="unknown operation tag 99"):
        decode(bytes(blob))


def test_disk_work_becomes_its_operations():
    msg = assemble(4, drops=(1, 2), disk=DiskOps(spills=((3, b"s" * 16, b"k" * 16),), ops=DISK_CLEAR | DISK_SYNC))
    assert [type(op).__name__ for op in msg.ops] == ["Spill", "Drop", "Clear", "Sync"]
    assert assemble(5, disk=DiskOps()).ops == ()


def test_wrong_version_names_both():
    blob = bytearray(encode(StepMessage(step=1)))
    struct.pack_into("<H", blob, 4, 9)
    with pytest.raises(StepVersionError, match=rf"version 9 from rank 0 differs from this rank's version "
                                               rf"{frame.VERSION}"):
        decode(bytes(blob))


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
    blob = bytearray(encode(assemble(1, groups=[Group(1, 0, 1)])))
    struct.pack_into("<I", blob, 20 + 6 + 4 + 16, 16)
    with pytest.raises(StepFormatError, match="unknown flags 0x10"):
        decode(bytes(blob))


def test_values_out_of_range():
    with pytest.raises(ValueError, match="id outside"):
        encode(assemble(0, new=[NewRequest(1, (2**32,))]))
    with pytest.raises(ValueError, match="id outside"):
        encode(assemble(0, new=[NewRequest(1, (-1,))]))
    with pytest.raises(ValueError, match="does not fit"):
        encode(assemble(0, cancelled=(2**64,)))


def test_numpy_prompt_and_big_prompt():
    prompt = np.arange(200_000, dtype=np.int64)
    out = decode(encode(assemble(0, new=[NewRequest(3, prompt)])))  # type: ignore[arg-type]
    assert out.ops[0].requests[0].prompt == tuple(range(200_000))


def test_seed_none_vs_zero():
    a = decode(encode(assemble(0, new=[NewRequest(1, (), Sampling(seed=None))])))
    b = decode(encode(assemble(0, new=[NewRequest(1, (), Sampling(seed=0))])))
    assert a.ops[0].requests[0].sampling.seed is None and b.ops[0].requests[0].sampling.seed == 0


def test_docs_layout_table_is_the_codec_s():
    doc = (Path(__file__).parents[2] / "docs" / "architecture.md").read_text()
    block = re.search(r"### Step message[^\n]*\n\n```\n(.*?)\n```", doc, re.S)
    assert block is not None, "docs/architecture.md has no step-message layout block"
    assert block.group(1) == layout(), "docs/architecture.md's step layout differs from engine.ops.codec.layout()"


class _Runner:
    """The worker's runner, reduced to states and a pool (no model: a message without rows)."""

    def __init__(self, pages: int = 8):
        self.kv = type("KV", (), {"pool": PagePool(pages), "host": None, "pages_needed": lambda s, n: -(-n // 4)})()

    def new_state(self):
        return SeqState()

    def release(self, state):
        self.kv.pool.release(state.pages)


def test_worker_checks_the_deltas_and_the_page_ids():
    w = Worker(_Runner(), rank=1)
    w.execute(assemble(0, new=[NewRequest(1, (5, 6))], leases=[(1, (3,))]))
    assert w.states[1].pages == [3] and w.requests[1].prompt == (5, 6)
    with pytest.raises(StepFormatError, match="out of step"):
        w.execute(assemble(0))
    with pytest.raises(StepFormatError, match="admitted twice"):
        w.execute(assemble(1, new=[NewRequest(1, (5,))]))
    with pytest.raises(StepFormatError, match="cancels unknown request 4"):
        w.execute(assemble(2, cancelled=(4,)))
    with pytest.raises(StepFormatError, match="schedules unknown request 2"):
        w.execute(assemble(3, groups=[Group(2, 0, 1)]))
    with pytest.raises(StepFormatError, match="leases pages this rank does not hold free"):
        w.execute(assemble(4, leases=[(1, (3,))]))
    with pytest.raises(StepFormatError, match="does not hold positions to 5"):
        w.execute(assemble(5, groups=[Group(1, 0, 5, (1, 2, 3, 4, 5))]))
    w.execute(assemble(6, cancelled=(1,)))
    assert w.requests == {} and w.runner.kv.pool.free_count == 8


def test_image_rows_round_trip_in_bf16_bits():
    from cupyglm.backend.lanes import BF16
    from cupyglm.engine.ops.image import Image

    rows = (np.arange(12, dtype=np.float32) - 5.5).reshape(3, 4).astype(BF16)
    tag = bytes(range(32))
    msg = assemble(3, new=[NewRequest(7, (1, 2, 3, 4, 5)), NewRequest(8, (1, 2))],
                   images=[(7, 1, rows, tag), (8, 0, rows[:1], b"")])
    out = decode(encode(msg))
    assert [type(op).__name__ for op in out.ops] == ["Admit", "Image"]
    (rid, start, got, got_tag), (_, _, _, no_tag) = out.get(Image).entries
    assert (rid, start, got_tag, no_tag) == (7, 1, tag, b"")
    assert got.dtype == BF16 and got.tobytes() == rows.tobytes()
    with pytest.raises(ValueError, match="2-D bf16"):
        encode(assemble(3, images=[(7, 1, rows.astype(np.float32), tag)]))
    with pytest.raises(ValueError, match="tag has 3 bytes"):
        encode(assemble(3, images=[(7, 1, rows, b"abc")]))
