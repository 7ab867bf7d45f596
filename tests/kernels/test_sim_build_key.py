"""The emulator's build cache is keyed on cuemu.h and every part it includes."""
from __future__ import annotations

import shutil

from cupyglm.kernels import sim_build

KERNEL = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] = 1.0f; }\n'


def test_header_parts_are_every_cuemu_part():
    parts = {p.name for p in sim_build.header_parts()}
    on_disk = {p.name for p in sim_build.HEADER.parent.glob("cuemu_*.h")}
    assert parts == on_disk and "cuemu_bf16.h" in parts


def test_key_changes_with_an_included_part(tmp_path, monkeypatch):
    hdr = tmp_path / "sim"
    shutil.copytree(sim_build.HEADER.parent, hdr)
    monkeypatch.setattr(sim_build, "HEADER", hdr / "cuemu.h")
    cu = tmp_path / "k.cu"
    cu.write_text(KERNEL)
    before = sim_build.prepare(cu)[0]
    assert sim_build.prepare(cu)[0] == before
    part = hdr / "cuemu_bf16.h"
    part.write_text(part.read_text() + "\n// changed\n")
    assert sim_build.prepare(cu)[0] != before
