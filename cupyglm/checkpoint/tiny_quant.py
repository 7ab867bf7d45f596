"""The tiny checkpoint quantised (`cupyglm-make-tiny --quant fp8|nvfp4`): the same random values as the bf16
tiny, with the projections the published FP8 release quantises (DSA q_a / q_b / kv_a / o_proj, the dense MLPs,
routed and shared experts; KDA, kv_b, the indexer, router, embeddings, lm_head, MTP eh_proj stay bf16) stored
in the format's layout (checkpoint/quant.py), and the format declared as the releases declare it.

FP8 uses 32 x 32 blocks here (the published 128 x 128 would not split the tiny's 64-row experts at TP=2);
the block size is read from `weight_block_size` like any other checkpoint's.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from cupyglm.backend.qweight import QWeight, quantize_fp8, quantize_nvfp4
from cupyglm.checkpoint import quant
from cupyglm.checkpoint.names import TEXT_PREFIX, TensorSpec
from cupyglm.config import ModelConfig

TINY_FP8_BLOCK = (32, 32)


def scheme_for(fmt: str, block: tuple[int, int] = TINY_FP8_BLOCK) -> quant.QuantScheme:
    s = quant.default_scheme(fmt)
    return quant.QuantScheme(fmt, block, s.exclude, s.source) if fmt == quant.FP8 else s


release_quantised = quant.release_quantised


def quantise(spec: TensorSpec, x: np.ndarray, scheme: quant.QuantScheme) -> dict[str, np.ndarray]:
    """One projection's stored tensors (names and dtypes of `quant.companions`)."""
    p = spec.name[: -len(".weight")]
    w = np.asarray(x, dtype=np.float32)
    if scheme.fmt == quant.FP8:
        v, s = quantize_fp8(w, scheme.block)
        return {spec.name: v.view(ml_dtypes.float8_e4m3fn), f"{p}.weight_scale_inv": s}
    v, s, s2 = quantize_nvfp4(w)
    return {spec.name: v, f"{p}.weight_scale": s.view(ml_dtypes.float8_e4m3fn), f"{p}.weight_scale_2": s2,
            f"{p}.input_scale": np.array(1.0, dtype=np.float32)}


def qweight(spec: TensorSpec, x: np.ndarray, scheme: quant.QuantScheme) -> QWeight:
    """The QWeight the loader would read back from `quantise` (bench's random models, no files)."""
    t = quantise(spec, x, scheme)
    return quant.read_qweight(lambda n: np.asarray(t[n]), spec, scheme)


def not_converted(cfg: ModelConfig, specs: list[TensorSpec]) -> list[str]:
    """The linear modules left bf16, in the published configs' `model.layers.N...` form."""
    out = []
    for s in specs:
        if s.part == "text" and len(s.shape) == 2 and s.name.endswith(".weight") and not release_quantised(s, cfg):
            out.append(s.name[: -len(".weight")].replace(TEXT_PREFIX, "model.", 1))
    return out


def declare(hf: dict, scheme: quant.QuantScheme, cfg: ModelConfig, specs: list[TensorSpec]) -> dict | None:
    """Add FP8's quantization_config to the config.json body `hf`; for NVFP4 return hf_quant_config.json's body."""
    skip = not_converted(cfg, specs)
    if scheme.fmt == quant.FP8:
        hf["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                     "weight_block_size": list(scheme.block), "modules_to_not_convert": skip}
        return None
    return {"producer": {"name": "cupyglm-make-tiny"},
            "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": quant.NVFP4_GROUP,
                             "exclude_modules": skip}}
