"""The arithmetic identity (backend/arithmetic.py): what the fingerprints carry, and the startup line where the
tensor core has no confirmed model."""
from __future__ import annotations

from cupyglm.backend import arithmetic as arith


def test_cpu_backends_run_the_sm90_model():
    assert arith.tc_arch("numpy") == arith.tc_arch("sim") == "sm_90"
    assert arith.identity("numpy") == f"arithmetic {arith.ARITHMETIC}, tensor core sm_90"
    assert arith.unconfirmed_note("numpy") is None


def test_an_unconfirmed_or_unknown_tensor_core_is_said(monkeypatch):
    monkeypatch.setattr(arith, "tc_arch", lambda backend: "sm_120")
    note = arith.unconfirmed_note("cuda")
    assert note.startswith("tensor core: sm_120 has an unconfirmed model") and "GPU against GPU" in note
    monkeypatch.setattr(arith, "tc_arch", lambda backend: "sm_75")
    assert arith.unconfirmed_note("cuda").startswith("tensor core: sm_75 has no model of its tensor core")
    monkeypatch.setattr(arith, "tc_arch", lambda backend: "sm_90")
    assert arith.unconfirmed_note("cuda") is None
