"""The plan of a quantised checkpoint: stored bytes (packed values + scales) per rank, from a named format
(`--quant`) or a checkpoint's own headers (`--model DIR`, no weight read)."""
from __future__ import annotations

import math

from cupyglm.checkpoint import quant
from cupyglm.checkpoint.loader import Checkpoint
from cupyglm.checkpoint.names import all_specs
from cupyglm.checkpoint.tiny import write_tiny
from cupyglm.cli.plan import main as plan_main
from cupyglm.config import preset
from cupyglm.engine.plan import GIB, weight_bytes
from cupyglm.memory import BF16_STORAGE as B16

FULL = preset("glm-5.3-flash")
BF16 = ["--storage", "bf16"]


def test_full_model_release_layout_counts_the_published_fp8_matrices():
    layout = quant.layout_for(FULL, "fp8")
    assert len(layout.names) == 37_338                 # the FP8 release's count of FP8 matrices (with MTP)


def test_stored_bytes_are_values_plus_scales():
    """One expert's gate_proj [2048, 4096] at TP=2 (row split): FP8 1 byte a value + a [8, 32] fp32 grid;
    NVFP4 half a byte a value + an e4m3 byte per 16 + the fp32 tensor scale."""
    spec = next(s for s in all_specs(FULL) if s.name.endswith("layers.3.mlp.experts.0.gate_proj.weight"))
    fp8 = quant.held_arrays(spec, quant.default_scheme("fp8"), 2)
    assert sum(math.prod(shape) * (4 if dt == "F32" else 1) for _, shape, dt in fp8) == 1024 * 4096 + 8 * 32 * 4
    nv = quant.held_arrays(spec, quant.default_scheme("nvfp4"), 2)
    assert sum(math.prod(shape) * (4 if dt == "F32" else 1) for _, shape, dt in nv) == 1024 * 2048 + 1024 * 256 + 4


def test_full_model_nvfp4_fits_two_96_gib_cards_and_fp8_does_not(capsys):
    nv = weight_bytes(FULL, 2, B16, quant.layout_for(FULL, "nvfp4"))
    assert 80 * GIB < nv < 90 * GIB < weight_bytes(FULL, 2, B16, quant.layout_for(FULL, "fp8"))
    assert plan_main(["--tp", "2", "--card-gib", "96", "--quant", "nvfp4", *BF16]) == 0
    out, _ = capsys.readouterr()
    assert "nvfp4 weights (37,338 projections packed + scales)" in out and f"weights {nv / GIB:.2f} GiB" in out
    assert plan_main(["--tp", "2", "--card-gib", "96", "--quant", "nvfp4", "--kv-host", *BF16]) == 0
    assert "window 1,048,576 tokens" in capsys.readouterr()[0]
    assert plan_main(["--tp", "2", "--card-gib", "96", "--quant", "fp8", *BF16]) == 1
    assert plan_main(["--tp", "4", "--card-gib", "141", "--quant", "fp8", *BF16]) == 0


def test_model_dir_reads_the_layout_from_the_headers(tmp_path, capsys):
    path = write_tiny(tmp_path / "fp8", quant="fp8")
    ckpt = Checkpoint.open(path)
    want = weight_bytes(ckpt.config, 2, B16, quant.layout_of(ckpt))
    assert want < weight_bytes(ckpt.config, 2, B16)
    for f in path.glob("*.safetensors"):               # headers only: the data may be anything
        data = bytearray(f.read_bytes())
        n = 8 + int.from_bytes(data[:8], "little")
        data[n:] = b"\xff" * (len(data) - n)
        f.write_bytes(bytes(data))
    assert plan_main(["--model", str(path), "--tp", "2", "--card-gib", "2", "--reserve-gib", "1", *BF16]) == 0
    out, _ = capsys.readouterr()
    assert "fp8 weights (183 projections packed + scales)" in out
    assert quant.layout_of(Checkpoint.open(path)) == quant.layout_of(ckpt)      # opened from headers alone
    assert plan_main(["--model", str(path), "--quant", "nvfp4", "--card-gib", "1"]) == 2


def test_roofline_decode_bytes_by_format():
    """A decode token reads the quantised projections' stored bytes: bf16 > fp8 > nvfp4, and the classes that
    hold no quantised projection read the same in every format."""
    from bench.roofline import step_bytes

    parts = {f: step_bytes(FULL, 2, 1, 4096, None if f == "bf16" else f) for f in ("bf16", "fp8", "nvfp4")}
    total = {f: sum(p.values()) for f, p in parts.items()}
    assert total["bf16"] > total["fp8"] > total["nvfp4"]
    for cls in ("lm_head", "kda state", "dsa kv"):
        assert parts["bf16"][cls] == parts["fp8"][cls] == parts["nvfp4"][cls]
    assert parts["nvfp4"]["gemv (experts)"] < 0.3 * parts["bf16"]["gemv (experts)"]
