"""The verify snapshot holds copies of the index tails: the model writes them in place (index_tail_pool), so a
verify call's writes must not reach the snapshot, and a restored state's writes must not reach it either."""
from __future__ import annotations

import numpy as np

from cupyglm.engine.verify import restore, snapshot
from cupyglm.kv.state import SeqState


def test_tails_survive_in_place_writes():
    st = SeqState(length=6)
    st.index_tail[3] = (np.arange(8, dtype=np.uint16).reshape(4, 2), np.ones((4, 2), np.uint16))
    want = [a.copy() for a in st.index_tail[3]]
    snap = snapshot(st, np)
    st.index_tail[3][0][2] = 99                        # a verify row written in place
    st.length = 9
    restore(st, snap, np)
    assert st.length == 6 and all(np.array_equal(a, w) for a, w in zip(st.index_tail[3], want))
    st.index_tail[3][1][0] = 7                         # the replay writes the restored tail in place
    assert all(np.array_equal(a, w) for a, w in zip(snap.index_tail[3], want))
