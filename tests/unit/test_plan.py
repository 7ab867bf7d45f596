"""The memory plan and cupyglm-plan."""
import dataclasses
import math
import subprocess
import sys

import pytest

from cupyglm.checkpoint.names import all_specs
from cupyglm.checkpoint.quant import layout_for
from cupyglm.cli.plan import main as plan_main
from cupyglm.config import preset
from cupyglm.engine.plan import (
    GIB, MIB, PlanError, fixed_state_bytes, kv_bytes_per_token, plan_memory, weight_bytes,
)
from cupyglm.memory import BF16_STORAGE as B16, FP32_STORAGE as F32

FULL = preset("glm-5.3-flash")
BF16 = ["--storage", "bf16"]


def test_bytes_per_token():
    assert kv_bytes_per_token(FULL, B16) == 13056
    assert kv_bytes_per_token(FULL, B16, kv_host=True) == 768
    assert kv_bytes_per_token(preset("tiny"), B16) == 432
    assert kv_bytes_per_token(preset("tiny"), F32) == 864           # bf16 values held in float32 arrays


def test_fixed_state_and_weights():
    kda = 34 * 64 * 128 * 128 * 4
    assert kda == 136 * MIB
    one, two = fixed_state_bytes(FULL, 1, B16), fixed_state_bytes(FULL, 2, B16)
    assert kda <= one < kda + 8 * MIB
    assert kda // 2 <= two < kda // 2 + 4 * MIB
    assert weight_bytes(FULL, 2, B16) < weight_bytes(FULL, 1, B16) < 2 * weight_bytes(FULL, 2, B16) + GIB
    assert weight_bytes(FULL, 2, B16, layout_for(FULL, "nvfp4")) < weight_bytes(FULL, 2, B16) / 3
    stored_f32 = sum(math.prod(s.shard_shape(8)) * 4 for s in all_specs(FULL) if s.dtype == "F32"
                     and not s.name.startswith(f"model.language_model.layers.{FULL.mtp_layer}."))
    assert stored_f32 > 0                                            # A_log, dt_bias, hc base/scale, router bias
    assert weight_bytes(FULL, 8, F32) == 2 * weight_bytes(FULL, 8, B16) - stored_f32   # only bf16 tensors double
    assert weight_bytes(FULL, 8, B16) < weight_bytes(FULL, 8, B16, mtp=True)      # the MTP layer when built


def test_cli_prints_bytes_per_token(capsys):
    rc = plan_main(["--config", "glm-5.3-flash", "--tp", "2", "--card-gib", "96", *BF16])
    out, err = capsys.readouterr()
    assert "13,056 bytes/token" in out and "bf16 stored in 2 bytes" in out
    assert rc == 1 and "PlanError: no room for KV pages" in err     # bf16 weights (~300 GiB a rank) do not fit
    rc = plan_main(["--config", "glm-5.3-flash", "--tp", "2", "--card-gib", "96", "--weights-gib", "86.2", *BF16])
    out, _ = capsys.readouterr()
    assert rc == 0
    assert "13,056 bytes/token" in out and "rank 0 plan (bf16 stored in 2 bytes): weights 86.20 GiB" in out
    assert "rank 1 plan" in out
    assert "no prompt cache" in out and "reserve 1.00 GiB" in out
    rc = plan_main(["--config", "glm-5.3-flash", "--tp", "2", "--card-gib", "96", "--weights-gib", "86.2",
                    "--kv-host", *BF16])
    out, _ = capsys.readouterr()
    assert rc == 0 and "768 bytes/token" in out


def test_cli_refuses_an_oversize_context(capsys):
    base = ["--config", "glm-5.3-flash", "--tp", "2", "--card-gib", "96", "--quant", "nvfp4", *BF16]
    assert plan_main(base) == 0
    out, _ = capsys.readouterr()
    window = int(out.strip().splitlines()[-1].split("window ")[1].split(" tokens")[0].replace(",", ""))
    assert 0 < window < FULL.max_position_embeddings          # memory, not a cap, decides this window
    assert plan_main(base + ["--context", str(window + 1)]) == 1
    _, err = capsys.readouterr()
    assert err.strip() == f"PlanError: --context {window + 1} does not fit: the largest window is {window:,} tokens"
    assert plan_main(base + ["--context", str(window)]) == 0
    assert plan_main(base + ["--context", "2000000"]) == 1
    _, err = capsys.readouterr()
    assert "exceeds the model's maximum context of 1,048,576 tokens" in err


def test_the_pick_does_not_cap_the_window():
    """The radix-select pick keeps no per-pool state in shared memory: memory (or the model's maximum) decides
    the window, well past the old kernel's 49,152 pools = 196,608 tokens."""
    kw = dict(storage=B16, tp=8, budget_bytes=141 * GIB)
    p = plan_memory(FULL, **kw)
    assert p.largest_window > FULL.max_position_embeddings
    assert p.context == FULL.max_position_embeddings and "the model's maximum context" in p.line()
    assert "pick" not in p.line()
    assert plan_memory(FULL, context=196_609, **kw).context == 196_609


def test_the_window_never_exceeds_the_models_maximum():
    small = dataclasses.replace(FULL, max_position_embeddings=100_000)
    kw = dict(storage=B16, tp=8, budget_bytes=141 * GIB)
    p = plan_memory(small, **kw)
    assert p.context == 100_000 and "the model's maximum context" in p.line()
    assert plan_memory(small, context=100_000, **kw).context == 100_000
    with pytest.raises(PlanError, match=r"--context 100,001 exceeds the model's maximum context of 100,000 tokens "
                                        r"\(max_position_embeddings"):
        plan_memory(small, context=100_001, **kw)
    with pytest.raises(PlanError, match="exceeds the model's maximum context of 1,048,576 tokens"):
        plan_memory(FULL, context=2_000_000, **kw)


def test_context_zero_is_the_largest_window():
    kw = dict(storage=B16, tp=2, budget_bytes=96 * GIB, weights=int(91.5 * GIB), parallel=2)
    p = plan_memory(FULL, **kw)
    assert p.context == p.num_pages * 512 == p.largest_window < FULL.max_position_embeddings
    assert p.free_bytes < p.page_bytes                        # every page that fits is in the pool
    assert plan_memory(FULL, context=p.context, **kw).context == p.context
    with pytest.raises(PlanError, match=f"--context {p.context + 1} does not fit: the largest window is "
                                        f"{p.context:,} tokens"):
        plan_memory(FULL, context=p.context + 1, **kw)
    # --kv-host: only pooled keys on the card; the host pages hold one full window unasked, so the model's
    # maximum fits where the device-resident pool holds a few hundred thousand tokens
    h = plan_memory(FULL, kv_host=True, **kw)
    assert h.bytes_per_token == 768 and h.host_pages == FULL.max_position_embeddings // 512
    assert h.context == h.largest_window == FULL.max_position_embeddings > 3 * p.largest_window
    assert h.gather_slots == FULL.max_position_embeddings
    assert "latent rows in host memory" in h.line() and "2,048 host pages" in h.line()
    # a device prompt cache takes from the pool; the host cache does not
    c = plan_memory(FULL, prompt_cache_gib=1, **kw)
    assert c.num_pages < p.num_pages and "prompt cache 1.00 GiB" in c.line()
    hc = plan_memory(FULL, prompt_cache_gib=1, host_cache=True, **kw)
    assert hc.num_pages == p.num_pages and "in host memory" in hc.line()


def test_explicit_kv_budget_pool_cap_and_pages():
    tiny = preset("tiny")
    p = plan_memory(tiny, storage=F32, kv_budget_bytes=MIB, page_tokens=16)
    assert p.num_pages == MIB // (16 * 864) and "--kv-gib" in p.line()
    capped = plan_memory(dataclasses.replace(tiny, max_position_embeddings=1024), storage=B16, budget_bytes=8 * GIB,
                         parallel=2, pool_cap=True)
    assert capped.context == 1024 and capped.num_pages == 2 * 1024 // 16
    assert plan_memory(tiny, storage=B16, budget_bytes=8 * GIB, kv_pages=40).num_pages == 40
    with pytest.raises(PlanError, match="--kv-pages 41 does not fit: at most 40 pages fit"):
        plan_memory(tiny, storage=B16, kv_budget_bytes=40 * 16 * 432, kv_pages=41)


def test_cli_runs_as_a_module():
    r = subprocess.run([sys.executable, "-m", "cupyglm.cli.plan", "--config", "glm-5.3-flash", "--tp", "2",
                        "--card-gib", "96", "--kv-host", "--quant", "nvfp4", *BF16], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "768 bytes/token" in r.stdout


def test_kv_host_counts_the_gather_and_sizes_host_pages():
    """--kv-host: the gather's device buffers (slots [window, R] bf16, their rows and miss flags, a mark per host
    row, and per KV layer a row cache of 8,192 rows with a cache mark per host row) are in the scratch; CUPYGLM_KV_HOST_GIB caps the host pages; a _GIB below one request's pages is refused by name."""
    kw = dict(storage=B16, tp=2, budget_bytes=96 * GIB, weights=int(73.2 * GIB), parallel=2)
    off = plan_memory(FULL, **kw)
    h = plan_memory(FULL, kv_host=True, context=65_536, **kw)
    rows = h.host_pages * 512
    assert h.host_pages == 128 and h.gather_slots == 65_536
    cache = 12 * (8192 * 512 * 2 + 8192 * 4 + rows * 4)                 # per KV layer: 8,192 cached rows
    assert h.gather_bytes == 65_536 * 512 * 2 + 2 * 65_536 * 4 + rows * 4 + cache
    assert h.scratch_bytes == off.scratch_bytes + h.gather_bytes
    g = plan_memory(FULL, kv_host=True, kv_host_bytes=4 * GIB, **kw)
    assert g.host_pages == 4 * GIB // (512 * 12 * 1024) == g.num_pages
    with pytest.raises(PlanError, match=r"CUPYGLM_KV_HOST_GIB=0.5 holds 85 host pages .* fewer than one "
                                        r"request's 128 \(--context 65,536 tokens\)"):
        plan_memory(FULL, kv_host=True, kv_host_bytes=GIB // 2, context=65_536, **kw)


def test_vision_host_frees_the_tower_on_rank_0(capsys):
    base = ["--config", "glm-5.3-flash", "--tp", "2", "--card-gib", "96", "--quant", "nvfp4", *BF16]
    lines = {}
    for flag in ("--no-vision-host", "--vision-host", "--no-vision"):
        assert plan_main(base + [flag]) == 0
        lines[flag] = capsys.readouterr()[0].splitlines()
    pages = {f: int(ls[-1].split(" pages")[0].split(", ")[-1].replace(",", "")) for f, ls in lines.items()}
    assert "vision tower 1.05 GiB," in lines["--no-vision-host"][1]
    assert "vision staging 0.06 GiB (tower 1.05 GiB in host memory)," in lines["--vision-host"][1]
    assert all("vision" not in ls[2] for ls in lines.values())                  # rank 1 holds no tower
    assert pages["--no-vision-host"] < pages["--vision-host"] < pages["--no-vision"]   # rank 0 bounds both ranks
    freed = (pages["--vision-host"] - pages["--no-vision-host"]) * 512 * 13056
    assert 0.98 * GIB < freed < 0.99 * GIB + 512 * 13056
    on, host = (plan_memory(FULL, storage=B16, tp=2, budget_bytes=96 * GIB, vision=True, vision_host=h,
                            quant=layout_for(FULL, "nvfp4")) for h in (False, True))
    assert on.vision_bytes - host.vision_bytes == host.vision_host_bytes - host.vision_bytes
    assert host.vision_host_bytes == on.vision_bytes and on.vision_host_bytes == 0
