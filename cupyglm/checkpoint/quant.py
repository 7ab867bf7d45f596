"""Quantised checkpoints: FP8 block-scaled and NVFP4 (ModelOpt) linear weights, read as stored.

Where the format is declared:
  fp8    config.json `quantization_config` {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [bn, bk],
         "activation_scheme": "dynamic", "modules_to_not_convert": [...]}
  nvfp4  `hf_quant_config.json` {"quantization": {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules":
         [...]}} (or config.json `quantization_config` {"quant_method": "modelopt", "quant_algo": "NVFP4", ...})
Any other method, algorithm, value format, block or group size is refused by name before a weight is read.

How a quantised projection `X.weight` [N, K] is stored (every companion split as the weight is):
  fp8    X.weight [N, K] F8_E4M3; X.weight_scale_inv [ceil(N / bn), ceil(K / bk)] F32 (multiplies)
  nvfp4  X.weight [N, K / 2] U8 (element 2i in the low nibble); X.weight_scale [N, K / 16] F8_E4M3;
         X.weight_scale_2 [] F32; X.input_scale [] F32 (activation scale; activations stay bf16, unused)
Which projections are quantised follows the checkpoint (its stored dtypes), within QUANTISABLE (the projections
the model reads only through its GEMMs, as the published FP8 release quantises them) and outside the config's
not-converted list; a TP size that would cut a scale block is refused naming the tensor.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import json
import math
import re
from pathlib import Path

from cupyglm.checkpoint.names import TEXT_PREFIX, TensorSpec

FP8, NVFP4 = "fp8", "nvfp4"
NVFP4_GROUP = 16
HF_QUANT_FILE = "hf_quant_config.json"
F8 = "F8_E4M3"

# DSA q_a / q_b / kv_a / o_proj, the dense MLPs, routed and shared experts (the FP8 release's quantised set).
QUANTISABLE = re.compile(
    r"\.layers\.\d+\.(self_attn\.(q_a_proj|q_b_proj|kv_a_proj_with_mqa|o_proj)"
    r"|mlp\.((experts\.\d+|shared_experts)\.)?(gate_proj|up_proj|down_proj))\.weight$")


class QuantError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class QuantScheme:
    fmt: str                                    # fp8 | nvfp4
    block: tuple[int, int] = (128, 128)         # fp8 weight_block_size [bn, bk]; nvfp4: (1, 16)
    exclude: tuple[str, ...] = ()               # module names or glob patterns kept unquantised
    source: str = "quantization_config"

    def excluded(self, name: str) -> bool:
        """Is the module of tensor `name` in the not-converted list (either naming form, globs allowed)?"""
        module = name.rsplit(".", 1)[0]
        forms = {module, module.replace(TEXT_PREFIX, "model.", 1)}
        return any(fnmatch.fnmatchcase(f, pat) or f == pat for f in forms for pat in self.exclude)


@dataclasses.dataclass(frozen=True)
class QuantLayout:
    """Which projections a checkpoint stores quantised, in which format (the plan's view of a checkpoint)."""
    scheme: QuantScheme
    names: frozenset[str]


def held_arrays(spec: TensorSpec, scheme: QuantScheme, tp: int) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, rank shape, stored dtype) of what a rank holds of a quantised projection (read_qweight's arrays:
    the NVFP4 input_scale is stored, not held; a per-tensor scale is held as [1])."""
    check_tp(spec, scheme, tp)
    return [(c.name, c.shard_shape(tp) or (1,), c.dtype) for c in companions(spec, scheme)
            if not c.name.endswith(".input_scale")]


def default_scheme(fmt: str) -> QuantScheme:
    """The format as the published releases use it (what make-tiny and `cupyglm-plan --quant` assume)."""
    if fmt == FP8:
        return QuantScheme(FP8, (128, 128))
    if fmt == NVFP4:
        return QuantScheme(NVFP4, (1, NVFP4_GROUP), source=HF_QUANT_FILE)
    raise QuantError(f"unknown quantisation format {fmt!r} (fp8 or nvfp4)")


def read_scheme(path: Path, config: dict) -> QuantScheme | None:
    """The checkpoint's declared quantisation (None: bf16). Refuses anything but FP8 block e4m3 and NVFP4."""
    qc = config.get("quantization_config")
    hf = path / HF_QUANT_FILE
    if hf.is_file():
        try:
            doc = json.loads(hf.read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise QuantError(f"{hf}: not valid JSON ({e})") from None
        q = doc.get("quantization") if isinstance(doc, dict) else None
        if not isinstance(q, dict):
            raise QuantError(f"{hf}: no 'quantization' object")
        return _modelopt(q, str(hf))
    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise QuantError("config.json: quantization_config is not an object")
    method = qc.get("quant_method")
    if method == "modelopt":
        return _modelopt(qc, "config.json quantization_config")
    if method != "fp8":
        raise QuantError(f"config.json: quantization_config quant_method {method!r} is not supported "
                         "(supported: 'fp8' with 128x128-style block scales, ModelOpt 'NVFP4')")
    where = "config.json quantization_config"
    if qc.get("fmt", "e4m3") != "e4m3":
        raise QuantError(f"{where}: fmt {qc.get('fmt')!r} is not supported (e4m3 only)")
    block = qc.get("weight_block_size")
    if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
        raise QuantError(f"{where}: weight_block_size {block!r}: only block-scaled FP8 ([bn, bk]) is supported")
    if qc.get("activation_scheme", "dynamic") != "dynamic":
        raise QuantError(f"{where}: activation_scheme {qc.get('activation_scheme')!r} is not supported "
                         "(dynamic only; activations stay bf16)")
    return QuantScheme(FP8, (block[0], block[1]), _names(qc.get("modules_to_not_convert"), where), where)


def _modelopt(q: dict, where: str) -> QuantScheme:
    algo = q.get("quant_algo")
    if algo != "NVFP4":
        raise QuantError(f"{where}: quant_algo {algo!r} is not supported (NVFP4 only)")
    if q.get("group_size", NVFP4_GROUP) != NVFP4_GROUP:
        raise QuantError(f"{where}: group_size {q.get('group_size')!r} is not supported (NVFP4 uses 16)")
    if q.get("kv_cache_quant_algo") not in (None, "null"):
        raise QuantError(f"{where}: kv_cache_quant_algo {q.get('kv_cache_quant_algo')!r} is not supported "
                         "(the KV pool stays bf16)")
    return QuantScheme(NVFP4, (1, NVFP4_GROUP), _names(q.get("exclude_modules", q.get("ignore")), where), where)


def _names(v, where: str) -> tuple[str, ...]:
    if v is None:
        return ()
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise QuantError(f"{where}: the not-converted module list must be a list of names")
    return tuple(v)


def quantisable(spec: TensorSpec) -> bool:
    return len(spec.shape) == 2 and bool(QUANTISABLE.search(spec.name))


def release_quantised(spec: TensorSpec, cfg) -> bool:
    """Does the published FP8 release quantise this tensor? (QUANTISABLE less the KDA layers' o_proj.)"""
    if not quantisable(spec):
        return False
    layer = int(re.search(r"\.layers\.(\d+)\.", spec.name).group(1))
    return not (layer < cfg.num_hidden_layers and cfg.layer_types[layer] == "linear_attention"
                and ".self_attn." in spec.name)


def layout_for(cfg, fmt: str) -> QuantLayout:
    """A checkpoint of `cfg` quantised by the release's rule in `fmt` (cupyglm-plan --quant, make-tiny)."""
    from cupyglm.checkpoint.names import all_specs

    return QuantLayout(default_scheme(fmt), frozenset(s.name for s in all_specs(cfg) if release_quantised(s, cfg)))


def layout_of(ckpt) -> QuantLayout | None:
    """An opened checkpoint's quantised projections (None: bf16, or a checkpoint-like object without them)."""
    scheme = getattr(ckpt, "scheme", None)
    return None if scheme is None else QuantLayout(scheme, frozenset(ckpt.quantised))


def stored_dtype(scheme: QuantScheme) -> str:
    """The safetensors dtype of a quantised `X.weight`."""
    return F8 if scheme.fmt == FP8 else "U8"


def companions(spec: TensorSpec, scheme: QuantScheme) -> list[TensorSpec]:
    """The stored tensors of one quantised projection, split as the projection is."""
    n, k = spec.shape
    p = spec.name[: -len(".weight")]
    if scheme.fmt == FP8:
        bn, bk = scheme.block
        return [TensorSpec(spec.name, (n, k), spec.split, F8, spec.part),
                TensorSpec(f"{p}.weight_scale_inv", (-(-n // bn), -(-k // bk)), spec.split, "F32", spec.part)]
    if k % NVFP4_GROUP:
        raise QuantError(f"{spec.name}: K={k} is not a multiple of NVFP4's group of {NVFP4_GROUP}")
    return [TensorSpec(spec.name, (n, k // 2), spec.split, "U8", spec.part),
            TensorSpec(f"{p}.weight_scale", (n, k // NVFP4_GROUP), spec.split, F8, spec.part),
            TensorSpec(f"{p}.weight_scale_2", (), "rep", "F32", spec.part),
            TensorSpec(f"{p}.input_scale", (), "rep", "F32", spec.part)]


def check_tp(spec: TensorSpec, scheme: QuantScheme, tp: int) -> None:
    """Refuse a TP size whose split of this quantised projection would cut a scale block, naming it."""
    if spec.split == "rep" or tp == 1:
        return
    dim = 0 if spec.split == "row" else 1
    size = spec.shape[dim]
    unit = scheme.block[dim] if scheme.fmt == FP8 else (1, NVFP4_GROUP)[dim]
    if size % tp or (size // tp) % unit:
        what = f"{scheme.block[0]}x{scheme.block[1]} FP8 scale blocks" if scheme.fmt == FP8 else \
            f"NVFP4 groups of {NVFP4_GROUP}"
        raise QuantError(f"{spec.name}: TP={tp} would cut its {what} (dim {dim} of {spec.shape} gives "
                         f"{size / tp:g} a rank, not a multiple of {unit})")


def stored_bytes(spec: TensorSpec, scheme: QuantScheme, tp: int) -> int:
    """One rank's bytes of a quantised projection: values + scales (the per-tensor scalars included)."""
    size = {"F8_E4M3": 1, "U8": 1, "F32": 4}
    return sum(math.prod(c.shard_shape(tp)) * size[c.dtype] for c in companions(spec, scheme))


def resolve(scheme: QuantScheme | None, table: dict[str, TensorSpec], stored: dict[str, str],
            where: str) -> tuple[set[str], dict[str, TensorSpec]]:
    """(the quantised projections, the table of every stored tensor) from the stored dtypes: a projection is
    quantised when the checkpoint stores it in the format's dtype. Refuses a quantised tensor outside
    QUANTISABLE or in the not-converted list, and quantised tensors in a checkpoint that declares no format."""
    if scheme is None:
        for name, dtype in stored.items():
            if dtype == F8:
                raise QuantError(f"{where}: tensor {name!r} is quantised ({dtype}) but the checkpoint declares no "
                                 "quantization_config or hf_quant_config.json")
        return set(), table
    qdtype = stored_dtype(scheme)
    quantised: set[str] = set()
    out: dict[str, TensorSpec] = {}
    for name, spec in table.items():
        if stored.get(name) != qdtype or spec.dtype == qdtype:
            out[name] = spec
            continue
        if not quantisable(spec):
            raise QuantError(f"{where}: tensor {name!r} is stored quantised ({qdtype}); cupyglm reads it in bf16 "
                             "only (quantised: DSA q_a/q_b/kv_a/o_proj, KDA o_proj, dense MLPs, experts)")
        if scheme.excluded(name):
            raise QuantError(f"{where}: tensor {name!r} is stored quantised but {scheme.source} lists its "
                             "module as not converted")
        quantised.add(name)
        out.update({c.name: c for c in companions(spec, scheme)})
    return quantised, out


def read_qweight(read, spec: TensorSpec, scheme: QuantScheme, tp: int = 1):
    """One rank's QWeight of a quantised projection; `read(name)` returns a stored tensor's rank slice at TP=tp
    (refused first when that split would cut a scale block)."""
    import numpy as np

    from cupyglm.backend.qweight import QWeight

    check_tp(spec, scheme, tp)
    p = spec.name[: -len(".weight")]
    values = read(spec.name).view(np.uint8)
    if scheme.fmt == FP8:
        n, k = values.shape
        return QWeight(FP8, (n, k), values, read(f"{p}.weight_scale_inv"), None, scheme.block)
    n, k = values.shape[0], values.shape[1] * 2
    return QWeight(NVFP4, (n, k), values, read(f"{p}.weight_scale").view(np.uint8),
                   read(f"{p}.weight_scale_2").reshape(1))
