"""The calls of one decode step and of one cold prefill of the whole model on one TP rank, each a Call of
bench/sass/calls.py: every projection of cupyglm.memory.weight_arrays (logical shapes from the bf16 table, stored
bytes from the format's), the attention / indexer of the DSA layers, the KDA state of the others, two norms a
layer. The tensors no kernel here models (hyper-connections, conv taps, biases, the embedding rows) count their
bytes at HBM bandwidth."""
from __future__ import annotations

import functools
import re

import numpy as np

from cupyglm.checkpoint.quant import layout_for
from cupyglm.memory import Storage, weight_arrays

from bench.sass import calls, hw

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


def _walk(cfg, tp: int, fmt: str, rows: int, gemv: bool, arch: str):
    """(label, Call) of every projection, and the bytes of the tensors left to memory alone."""
    plain, stored, storage = _tables(cfg, tp, fmt)
    out, small = [], 0.0
    slices, per = _experts(cfg, rows)
    for name, a in plain.items():
        if not _projection(name, a):
            small += rows * a.shape[-1] * 2 if "embed_tokens" in name else a.nbytes(storage)
            continue
        f = fmt if stored[name] != a.nbytes(storage) else "bf16"
        n, k = a.shape
        m = _EXPERT.search(name)
        if m and m.group(1) != "0":
            continue                                   # one grouped call a layer, from expert 0's shape
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


def decode_calls(cfg, tp: int, fmt: str, batch: int, context: int, arch: str = "sm_90"):
    """(label, Call) list of one decode step of `batch` rows at `context`, and the bytes left to memory."""
    out, small = _walk(cfg, tp, fmt, batch, True, arch)
    for _ in cfg.dsa_layers:
        out += [("attention", c) for c in calls.attention_decode(cfg, tp, batch, context, arch)]
        out.append(("indexer", calls.index_decode(cfg, batch, context, arch)))
    out += [("kda state", calls.kda_decode(cfg, tp, batch, arch)) for _ in cfg.kda_layers]
    out += [("norms", calls.norm(cfg, batch, arch)) for _ in range(2 * cfg.num_hidden_layers)]
    return out, small


def prefill_calls(cfg, tp: int, fmt: str, tokens: int, arch: str = "sm_90"):
    """(label, Call) list of one cold prefill of `tokens` tokens (one pass), and the bytes left to memory."""
    out, small = _walk(cfg, tp, fmt, tokens, False, arch)
    out += [("attention", calls.attention_prompt(cfg, tp, tokens, arch)) for _ in cfg.dsa_layers]
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
            "attention", "indexer", "kda state", "norms", "lm_head") else "projections"
        by[key] = by.get(key, 0.0) + bounds(c)["predicted_us"]
    by["other tensors (memory)"] = small / hw.HBM_BYTES_S * 1e6
    return sum(by.values()), by
