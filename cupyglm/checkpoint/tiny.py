"""The tiny checkpoint: a deterministic random model of the full architecture at tiny sizes.

`write_tiny(dir, seed)` writes a Hugging Face directory laid out as the published checkpoint (config.json with
text_config and vision_config; two safetensors shards + index holding every tensor of the split table, the tiny
vision tower's too, under the real names and in the real dtypes; tokenizer.json, tokenizer_config.json with the
image tokens; preprocessor_config.json). Each tensor draws from its own generator seeded by (seed, a hash of
its name), so adding a tensor shifts no other. Same seed -> byte-identical files.

`default_tiny_dir()` builds it once into the cache (`env.cache_dir()`) and returns the directory; several
processes may call it at once (a file lock around the build, a temp dir renamed into place, a completion
marker written before the rename).
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np

from cupyglm import env
from cupyglm.checkpoint import names, tiny_quant
from cupyglm.checkpoint.loader import DTYPES, INDEX_FILE, write_safetensors
from cupyglm.checkpoint.tiny_tokenizer import (build_tiny_tokenizer, tiny_eos_token_ids, tiny_tokenizer_config,
                                                vision_token_ids)
from cupyglm.config import ModelConfig, preset
from cupyglm.vision.processor import PREPROCESSOR_FILE, ProcessorConfig

# Bump when the generator (init rules, tokenizer, file layout) changes: cached tiny dirs are keyed by it.
TINY_FORMAT_VERSION = 3
MARKER = ".cupyglm-complete"
N_SHARDS = 2

# Hyper-connection mix weights: X_flat is RMS-normalised over 4D values, so a row of fn drawn with std
# HC_FN_GAIN / sqrt(4D) gives mix logits ~ N(0, HC_FN_GAIN): token-dependent, and with the base
# (N(0, 0.5)) and scale (U(0.5, 1.5)) the Sinkhorn-balanced 4x4 comb is far from uniform and from identity.
HC_FN_GAIN = 0.5

# Dense-layer MLP (layers below first_k_dense_replace): gate/up pre-activations ~ N(0, GAIN^2) on RMS-normed
# rows, so about 1% of them pass the swiglu limit (10) and the clamp shapes these layers' output; down_proj is
# scaled by 1 / GAIN^2 so that output stays O(1).
DENSE_MLP_GAIN = 4.0
DENSE_UP = re.compile(r"\.layers\.\d+\.mlp\.(gate|up)_proj\.weight$")
DENSE_DOWN = re.compile(r"\.layers\.\d+\.mlp\.down_proj\.weight$")

# The tiny image processor's budget: 16..64 image tokens, so a 112x112 image is 16 tokens and larger ones shrink.
TINY_PREPROCESSOR = {"min_image_tokens": 16, "max_image_tokens": 64}

BUILD_COUNT = 0          # times this process built a default tiny dir (tests read it)


# ---- initial values ---------------------------------------------------------------------------------------
def _rng(seed: int, name: str) -> np.random.Generator:
    key = int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:16], "little")
    return np.random.default_rng(np.random.SeedSequence([int(seed), key]))


def _normal(rng, shape, std, mean=0.0) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32) * np.float32(std) + np.float32(mean)


def _uniform(rng, shape, lo, hi) -> np.ndarray:
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def init_tensor(spec: names.TensorSpec, config: ModelConfig, seed: int) -> np.ndarray:
    """The tiny checkpoint's value of one tensor in its stored dtype, chosen so the random model's activations
    stay O(1) and its logits are not degenerate."""
    name, shape = spec.name, spec.shape
    rng = _rng(seed, name)
    d = config.hidden_size
    if name == f"{names.TEXT_PREFIX}embed_tokens.weight":
        x = _normal(rng, shape, 1.0)
    elif name == "lm_head.weight":
        x = _normal(rng, shape, 1.0 / math.sqrt(d))
    elif name.endswith(".A_log"):
        x = np.log(_uniform(rng, shape, 1.0, 16.0))
    elif name.endswith(".dt_bias"):
        x = _normal(rng, shape, 0.5)
    elif name.endswith(".k_norm.bias"):
        x = _normal(rng, shape, 0.1)
    elif name.endswith(".e_score_correction_bias"):
        x = _normal(rng, shape, 0.1)
    elif re.search(r"\.hc_[a-z]+_fn$", name):
        x = _normal(rng, shape, HC_FN_GAIN / math.sqrt(shape[1]))
    elif re.search(r"\.hc_[a-z]+_base$", name):
        x = _normal(rng, shape, 0.5)
    elif re.search(r"\.hc_[a-z]+_scale$", name):
        x = _uniform(rng, shape, 0.5, 1.5)
    elif name.endswith(".indexer.index_kpool_compress_ape"):
        x = _normal(rng, shape, 0.5)
    elif name.endswith(".indexer.index_kpool_compress_gate"):                # [I, D] projection
        x = _normal(rng, shape, 1.0 / math.sqrt(shape[1]))
    elif DENSE_UP.search(name):
        x = _normal(rng, shape, DENSE_MLP_GAIN / math.sqrt(shape[1]))
    elif DENSE_DOWN.search(name):
        x = _normal(rng, shape, 1.0 / (DENSE_MLP_GAIN ** 2 * math.sqrt(shape[1])))
    elif name.endswith(".bias"):                                            # the vision tower's biases
        x = _normal(rng, shape, 0.02)
    elif name.endswith(".weight") and len(shape) == 1:          # every norm weight
        x = _normal(rng, shape, 0.1, mean=1.0)
    elif name.endswith(".weight") and len(shape) >= 2:          # projections, routers, convs: [out, in...]
        x = _normal(rng, shape, 1.0 / math.sqrt(math.prod(shape[1:])))
    else:
        raise ValueError(f"tiny checkpoint: no init rule for tensor {name!r} of shape {shape}")
    x = np.asarray(x, dtype=np.float32).reshape(shape)
    return x.astype(DTYPES[spec.dtype])


def tiny_config(config: ModelConfig | None = None) -> ModelConfig:
    """The config the tiny generator works from: `config`, or the `tiny` preset. (write_tiny writes it with
    the tiny tokenizer's eos ids, which the preset already carries.)"""
    return config or preset("tiny")


def tiny_tensors(config: ModelConfig | None = None, seed: int = 0) -> dict[str, np.ndarray]:
    """Every tensor of `names.checkpoint_specs(config)` as the generator makes it, in split-table order."""
    cfg = tiny_config(config)
    return {s.name: init_tensor(s, cfg, seed) for s in names.checkpoint_specs(cfg)}


def shard_file_name(i: int, n: int = N_SHARDS) -> str:
    return f"model-{i + 1:05d}-of-{n:05d}.safetensors"


# ---- writing ------------------------------------------------------------------------------------------
def write_tiny(out_dir: str | Path, seed: int = 0, config: ModelConfig | None = None,
               quant: str | None = None) -> Path:
    """Write the tiny checkpoint into `out_dir` (created if missing; files there are overwritten).
    Returns the directory. Deterministic: the same seed and config give byte-identical files. quant="fp8" or
    "nvfp4": the same values with the release's projections stored quantised (checkpoint/tiny_quant.py)."""
    if seed < 0:
        raise ValueError(f"seed must be non-negative, got {seed}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = tiny_config(config)

    tok = build_tiny_tokenizer(cfg.vocab_size)
    eos = tiny_eos_token_ids(tok)
    if tuple(cfg.eos_token_ids) != eos:
        cfg = dataclasses.replace(cfg, eos_token_ids=eos)
    if cfg.vision is not None and cfg.vision.token_ids != vision_token_ids(tok):
        cfg = dataclasses.replace(cfg, vision=dataclasses.replace(cfg.vision, **vision_token_ids(tok)))

    # Tensors: split-table order, cut into N_SHARDS files of about equal bytes.
    specs = names.checkpoint_specs(cfg)
    sizes = [math.prod(s.shape) * DTYPES[s.dtype].itemsize for s in specs]
    total = sum(sizes)
    groups: list[list[names.TensorSpec]] = [[] for _ in range(N_SHARDS)]
    acc = 0
    for spec, size in zip(specs, sizes):
        groups[min(N_SHARDS - 1, acc * N_SHARDS // total)].append(spec)
        acc += size
    weight_map: dict[str, str] = {}
    scheme = tiny_quant.scheme_for(quant) if quant else None
    total = 0
    for i, group in enumerate(groups):
        fname = shard_file_name(i)
        tensors = {}
        for s in group:
            x = init_tensor(s, cfg, seed)
            if scheme is not None and tiny_quant.release_quantised(s, cfg):
                tensors.update(tiny_quant.quantise(s, x, scheme))
            else:
                tensors[s.name] = x
        total += sum(int(t.nbytes) for t in tensors.values())
        write_safetensors(out / fname, tensors, metadata={"format": "pt"})
        weight_map.update({n: fname for n in tensors})
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    _write_text(out / INDEX_FILE, json.dumps(index, indent=2) + "\n")

    _write_text(out / "tokenizer.json", tok.to_str(pretty=True))
    _write_text(out / "tokenizer_config.json",
                json.dumps(tiny_tokenizer_config(tok), indent=2, ensure_ascii=False) + "\n")
    hf = cfg.to_hf_dict()
    modelopt = tiny_quant.declare(hf, scheme, cfg, specs) if scheme is not None else None
    if modelopt is not None:
        _write_text(out / tiny_quant.quant.HF_QUANT_FILE, json.dumps(modelopt, indent=2) + "\n")
    _write_text(out / "config.json", json.dumps(hf, indent=2) + "\n")
    if cfg.vision is not None:
        _write_text(out / PREPROCESSOR_FILE, json.dumps(_preprocessor(cfg), indent=2) + "\n")
    return out


def _preprocessor(cfg: ModelConfig) -> dict:
    v = cfg.vision
    return ProcessorConfig(patch_size=v.patch_size, temporal_patch_size=v.temporal_patch_size,
                           merge_size=v.spatial_merge_size, **TINY_PREPROCESSOR).to_dict()


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


# ---- the cached default -----------------------------------------------------------------------------------
def tiny_dir_name(seed: int = 0, config: ModelConfig | None = None, quant: str | None = None) -> str:
    cfg = tiny_config(config)
    return f"tiny-{cfg.identity()}-g{TINY_FORMAT_VERSION}-seed{seed}" + (f"-{quant}" if quant else "")


def _complete(path: Path) -> bool:
    return (path / MARKER).is_file()


@contextlib.contextmanager
def _file_lock(path: Path):
    try:
        import fcntl
    except ImportError:         # no flock: the rename below still keeps one complete winner
        yield
        return
    with open(path, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def default_tiny_dir(seed: int = 0, quant: str | None = None) -> Path:
    """The built-in tiny checkpoint, built once into `env.cache_dir()` and reused. Safe to call from several
    processes at once: one builds (under a file lock, into a temp dir renamed into place), the rest wait and
    reuse it; a builder that loses a rename race discards its copy and uses the winner's."""
    global BUILD_COUNT
    root = env.cache_dir()
    final = root / tiny_dir_name(seed, quant=quant)
    if _complete(final):
        return final
    root.mkdir(parents=True, exist_ok=True)
    with _file_lock(root / f".{final.name}.lock"):
        if _complete(final):
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=root))
        try:
            os.chmod(tmp, 0o755)
            write_tiny(tmp, seed=seed, quant=quant)
            marker = {"seed": seed, "format": TINY_FORMAT_VERSION, "config": tiny_config().identity(), "quant": quant}
            (tmp / MARKER).write_text(json.dumps(marker) + "\n")
            if final.exists() and not _complete(final):
                shutil.rmtree(final, ignore_errors=True)        # a leftover without its marker
            try:
                os.rename(tmp, final)
            except OSError:
                if _complete(final):                            # lost the race: use the winner's
                    shutil.rmtree(tmp, ignore_errors=True)
                    return final
                raise
            BUILD_COUNT += 1
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return final
