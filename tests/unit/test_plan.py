"""The memory plan and cupyglm-plan."""
import subprocess
import sys

import pytest

from cupyglm.cli.plan import main as plan_main
from cupyglm.config import preset
from cupyglm.engine.plan import (
    GIB, MIB, PlanError, fixed_state_bytes, kv_bytes_per_token, plan_memory, weight_bytes,
)

FULL = preset("glm-5.3-flash")


def test_bytes_per_token():
    assert kv_bytes_per_token(FULL) == 13056
    assert kv_bytes_per_token(FULL, kv_host=True) == 768
    assert kv_bytes_per_token(preset("tiny")) == 432


def test_fixed_state_and_weights():
    kda = 34 * 64 * 128 * 128 * 4
    assert kda == 136 * MIB
    one, two = fixed_state_bytes(FULL, 1), fixed_state_bytes(FULL, 2)
    assert kda <= one < kda + 8 * MIB
    assert kda // 2 <= two < kda // 2 + 4 * MIB
    assert weight_bytes(FULL, 2) < weight_bytes(FULL, 1) < 2 * weight_bytes(FULL, 2) + GIB
    assert weight_bytes(FULL, 2, weight_bits=4) < weight_bytes(FULL, 2) / 3


def test_cli_prints_bytes_per_token(capsys):
    rc = plan_main(["--config", "glm-5.3-flash", "--tp", "2", "--card-gib", "96"])
    out, err = capsys.readouterr()
    assert "13,056 bytes/token" in out
    assert rc == 1 and "PlanError: no room for KV pages" in err     # bf16 weights (~300 GiB a rank) do not fit
    rc = plan_main(["--config", "glm-5.3-flash", "--tp", "2", "--card-gib", "96", "--weights-gib", "86.2"])
    out, _ = capsys.readouterr()
    assert rc == 0
    assert "13,056 bytes/token" in out and "rank 0 plan: weights 86.20 GiB" in out and "rank 1 plan:" in out
    assert "no prompt cache" in out and "reserve 1.00 GiB" in out
    rc = plan_main(["--config", "glm-5.3-flash", "--tp", "2", "--card-gib", "96", "--weights-gib", "86.2",
                    "--kv-host"])
    out, _ = capsys.readouterr()
    assert rc == 0 and "768 bytes/token" in out


def test_cli_refuses_an_oversize_context(capsys):
    base = ["--config", "glm-5.3-flash", "--tp", "2", "--card-gib", "96", "--weight-bits", "4"]
    assert plan_main(base) == 0
    out, _ = capsys.readouterr()
    window = int(out.strip().splitlines()[-1].split("window ")[1].split(" tokens")[0].replace(",", ""))
    assert plan_main(base + ["--context", "2000000"]) == 1
    _, err = capsys.readouterr()
    assert err.strip() == f"PlanError: --context 2000000 does not fit: the largest window is {window:,} tokens"
    assert plan_main(base + ["--context", str(window)]) == 0


def test_context_zero_is_the_largest_window():
    kw = dict(tp=2, budget_bytes=96 * GIB, weights=int(86.2 * GIB), parallel=2)
    p = plan_memory(FULL, **kw)
    assert p.context == p.num_pages * 512 == p.largest_window
    assert p.free_bytes < p.page_bytes                        # every page that fits is in the pool
    assert plan_memory(FULL, context=p.context, **kw).context == p.context
    with pytest.raises(PlanError, match=f"--context {p.context + 1} does not fit: the largest window is "
                                        f"{p.context:,} tokens"):
        plan_memory(FULL, context=p.context + 1, **kw)
    # --kv-host: only pooled keys on the card, so the window is ~17x longer
    h = plan_memory(FULL, kv_host=True, **kw)
    assert h.bytes_per_token == 768 and h.context > 16 * p.context
    assert "latent rows in host memory" in h.line()
    # a device prompt cache takes from the pool; the host cache does not
    c = plan_memory(FULL, prompt_cache_gib=2, **kw)
    assert c.num_pages < p.num_pages and "prompt cache 2.00 GiB" in c.line()
    hc = plan_memory(FULL, prompt_cache_gib=2, host_cache=True, **kw)
    assert hc.num_pages == p.num_pages and "in host memory" in hc.line()


def test_explicit_kv_budget_pool_cap_and_pages():
    tiny = preset("tiny")
    p = plan_memory(tiny, kv_budget_bytes=MIB, kv_itemsize=4, page_tokens=16)
    assert p.num_pages == MIB // (16 * 864) and "--kv-gib" in p.line()
    capped = plan_memory(tiny, budget_bytes=8 * GIB, parallel=2, pool_cap=True, max_window=1024)
    assert capped.context == 1024 and capped.num_pages == 2 * 1024 // 16
    assert plan_memory(tiny, budget_bytes=8 * GIB, kv_pages=40).num_pages == 40
    with pytest.raises(PlanError, match="--kv-pages 41 does not fit: at most 40 pages fit"):
        plan_memory(tiny, kv_budget_bytes=40 * 16 * 432, kv_pages=41)


def test_cli_runs_as_a_module():
    r = subprocess.run([sys.executable, "-m", "cupyglm.cli.plan", "--config", "glm-5.3-flash", "--tp", "2",
                        "--card-gib", "96", "--kv-host", "--weight-bits", "4"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "768 bytes/token" in r.stdout
