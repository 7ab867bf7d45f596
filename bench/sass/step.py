"""The calls of one decode step and of one cold prefill of the whole model on one TP rank, each a Call of
bench/sass/calls.py: every projection of cupyglm.memory.weight_arrays (logical shapes from the bf16 table, stored
bytes from the format's), the attention / indexer of the DSA layers, the KDA state of the others, two norms a
layer. A prefill's prompt GEMMs and DSA attention run on the lane-16 kernels or on the tensor core
(bench/sass/prompt_tc.py, attention_tc); its lm_head on the last row alone. The tensors no kernel here models
(hyper-connections, conv taps, biases, the embedding rows) count their bytes at HBM bandwidth."""
from __future__ import annotations

import functools
import re

import numpy as np

from cupyglm.checkpoint.quant import layout_for
from cupyglm.memory import Storage, weight_arrays

from bench.sass import calls, hw, prompt_tc

_SCALE = re.compile(r"\.weight_scale(_inv|_2)?$")
_EXPERT = re.compile(r"\.experts\.(\d+)\.(gate|up|down)_proj\.weight$")
_PAIRED = re.compile(r"\.(gate|up)_proj\.weight$")


@functools.lru_cache(maxsize=None)
def _tables(cfg, tp: int, fmt: str):
    """(bf16 arrays by name, stored bytes of each projection in fmt by its .weight name)."""
    storage = Storage(np.dtype(np.uint16))
    plain = {a.name: a for a in weight_arrays(cfg, tp)}
    stored: dict[str, int] = {}
    for a in weight_arrays(cfg, tp, quant=layout_for(cfg, fmt) if fmt != "bf16" else None):
        base = _SCALE.sub(".weight", a.name)
        stored[base] = stored.get(base, 0) + a.nbytes(storage)
    return plain, stored, storage


def _projection(name: str, a) -> bool:
    return name.endswith(".weight") and len(a.shape) == 2 and "embed_tokens" not in name and min(a.shape) > 1 \
        and not re.search(r"(norm|conv)", name)


def _experts(cfg, rows: int) -> tuple[float, int]:
    """(the expected distinct experts `rows` tokens touch, rows each of them gets)."""
    e, k = cfg.n_routed_experts, cfg.num_experts_per_tok
    slices = e * (1 - (1 - k / e) ** rows)
    return slices, max(1, round(rows * k / slices))


def _walk(cfg, tp: int, fmt: str, rows: int, path: str, arch: str):
    """(label, Call) of every projection, and the bytes of the tensors left to memory alone. path: "gemv" (decode
    rows), "gemm" (prompt rows, lane-16 GEMMs) or "tc" (prompt rows on the tensor core, prompt_tc). A prefill's
    lm_head runs on its last row alone (the one whose logits are sampled)."""
    plain, stored, storage = _tables(cfg, tp, fmt)
    out, small = [], 0.0
    slices, per = _experts(cfg, rows)
    gemv = path == "gemv"
    for name, a in plain.items():
        if not _projection(name, a):
            small += rows * a.shape[-1] * 2 if "embed_tokens" in name else a.nbytes(storage)
            continue
        f = fmt if stored[name] != a.nbytes(storage) else "bf16"
        n, k = a.shape
        m = _EXPERT.search(name)
        if m and m.group(1) != "0":
            continue                                   # one grouped call a layer, from expert 0's shape
        if "lm_head" in name and not gemv:
            out.append(("lm_head", calls.gemv("dense", f, n, k, 1, stored[name], out_bytes=4, arch=arch)))
            continue
        if path == "tc":
            out += _tc(cfg, tp, f, name, n, k, rows, stored[name], slices, arch)
            continue
        if m:
            grouped = "grouped swiglu" if m.group(2) != "down" else "grouped"
            if m.group(2) == "up":
                continue
            nw = 2 if m.group(2) == "gate" else 1
            label = f"experts {m.group(2)}{'+up' if nw == 2 else ''}"
            if gemv:
                c = calls.gemv(grouped, f, n, k, per, stored[name], nw, slices, arch=arch,
                               collective=m.group(2) == "down" and tp > 1)
            else:
                c = calls.gemm(grouped, f, rows * cfg.num_experts_per_tok, n, k, stored[name], nw, arch,
                               slices=min(cfg.n_routed_experts, rows * cfg.num_experts_per_tok))
            out.append((label, c))
            continue
        if _PAIRED.search(name) and name.replace("gate_proj", "up_proj") in plain:
            if ".up_proj." in name:
                continue
            form, nw = "swiglu", 2
        else:
            form, nw = "dense", 1
        coll = tp > 1 and (name.endswith("o_proj.weight") or name.endswith("mlp.down_proj.weight"))
        label = re.sub(r"^.*layers\.\d+\.", "", name).replace(".weight", "")
        if gemv:
            c = calls.gemv(form, f, n, k, rows, stored[name], nw, out_bytes=4 if "lm_head" in name else 2,
                           arch=arch, collective=coll)
        else:
            c = calls.gemm(form, f, rows, n, k, stored[name], nw, arch)
        out.append((label, c))
    return out, small


def _tc(cfg, tp: int, f: str, name: str, n: int, k: int, rows: int, stored: float, slices: float, arch: str):
    """A projection's (label, Call)s on the tensor core (prompt_tc): experts grouped over their routed rows,
    gate / up pairs as SwiGLU, kv_b as the absorbed per-head pair; dequantisation passes labelled "dequant"."""
    m = _EXPERT.search(name)
    label = re.sub(r"^.*layers\.\d+\.", "", name).replace(".weight", "")
    if m:
        if m.group(2) == "up":
            return []
        r = rows * cfg.num_experts_per_tok
        got = (prompt_tc.swiglu(f, r, n, k, stored, slices, arch) if m.group(2) == "gate"
               else prompt_tc.gemm(f, r, n, k, stored, experts=slices, arch=arch))
        return [(lb if lb == "dequant" else f"experts {m.group(2)}{'+up' if m.group(2) == 'gate' else ''}", c)
                for lb, c in got]
    if _PAIRED.search(name) and name.replace("gate_proj", "up_proj") in _tables(cfg, tp, f)[0]:
        if ".up_proj." in name:
            return []
        got = prompt_tc.swiglu(f, rows, n, k, stored, arch=arch)
    elif name.endswith("kv_b_proj.weight"):
        got = prompt_tc.per_head_absorb(cfg, tp, rows, arch)
    else:
        got = prompt_tc.gemm(f, rows, n, k, stored, arch=arch)
    return [(lb if lb == "dequant" else label, c) for lb, c in got]


def decode_calls(cfg, tp: int, fmt: str, batch: int, context: int, arch: str = "sm_90"):
    """(label, Call) list of one decode step of `batch` rows at `context`, and the bytes left to memory."""
    out, small = _walk(cfg, tp, fmt, batch, "gemv", arch)
    for _ in cfg.dsa_layers:
        out += [("attention", c) for c in calls.attention_decode(cfg, tp, batch, context, arch)]
        out.append(("indexer", calls.index_decode(cfg, batch, context, arch)))
    out += [("kda state", calls.kda_decode(cfg, tp, batch, arch)) for _ in cfg.kda_layers]
    out += [("norms", calls.norm(cfg, batch, arch)) for _ in range(2 * cfg.num_hidden_layers)]
    return out, small


def prefill_calls(cfg, tp: int, fmt: str, tokens: int, arch: str = "sm_90", tc: bool = False):
    """(label, Call) list of one cold prefill of `tokens` tokens (one pass), and the bytes left to memory; tc:
    the prompt GEMMs and DSA attention on the tensor-core kernels (prompt_tc, attention_tc), else lane-16."""
    out, small = _walk(cfg, tp, fmt, tokens, "tc" if tc else "gemm", arch)
    att = calls.attention_tc_prompt if tc else calls.attention_prompt
    out += [("attention", att(cfg, tp, tokens, arch)) for _ in cfg.dsa_layers]
    out += [("indexer", calls.index_prompt(cfg, tokens, arch)) for _ in cfg.dsa_layers]
    out += [("kda state", calls.kda_prompt(cfg, tp, tokens, arch)) for _ in cfg.kda_layers]
    out += [("norms", calls.norm(cfg, tokens, arch)) for _ in range(2 * cfg.num_hidden_layers)]
    return out, small


def total_us(call_list, small: float) -> tuple[float, dict[str, float]]:
    """The step's time (us): every call's prediction plus the memory-only bytes; and the time by label."""
    from bench.sass.model import bounds

    by: dict[str, float] = {}
    for label, c in call_list:
        key = "experts" if label.startswith("experts") else label if label in (
            "attention", "indexer", "kda state", "norms", "lm_head", "dequant") else "projections"
        by[key] = by.get(key, 0.0) + bounds(c)["predicted_us"]
    by["other tensors (memory)"] = small / hw.HBM_BYTES_S * 1e6
    return sum(by.values()), by
