"""The rank handshake: before any weight is read, every rank all-gathers a versioned fingerprint of the settings
that must agree, and all ranks refuse together, with one line naming the setting and how it is set, on any
difference or on any rank's invalid setting.

Fingerprint (a JSON object; VERSION is bumped whenever a key is added, removed or changes meaning):

    version             VERSION
    model               model_identity(--model): SHA-256 of the checkpoint's config.json bytes (and of
                        hf_quant_config.json's, where the checkpoint has one), or "builtin-tiny"
    backend             the resolved backend (auto resolved on each rank, so a cuda rank never pairs with a numpy one)
    arithmetic          backend/arithmetic.identity: the ARITHMETIC version and the tensor core's architecture
                        (the device's on cuda), so ranks whose bits would differ never pair
    context, parallel, page_tokens, kv_cache, kv_pages, kv_gib, prompt_cache_gib,
    prompt_cache_disk (whether --prompt-cache-dir is set; the directory itself is not compared),
    prompt_cache_disk_gib, host_cache, kv_share, kv_host_gib, mtp_drafts, memory_reserve_gib, max_queue, seed,
    prefill_chunk, vision, vision_max_images, vision_image_tokens, vision_urls, vision_host
                        the Settings fields of those names
    kv_host             the combined kv host mode (0 off, 1 per-rank host rows, 2 shared per host), so a rank
                        that differs in CUPYGLM_KV_HOST or CUPYGLM_KV_HOST_SHARED is named by both variables

Left out on purpose, because they differ per rank: the rank's own device index (its node-local rank),
CUDA_VISIBLE_DEVICES and other device-selection variables, host names, process ids, CUPYGLM_CACHE_DIR,
CUPYGLM_DEBUG and CUPYGLM_SIM_ORDER (which changes no result), and the per-launch token (rank 0's is used).

Each rank contributes a payload {"ok": true, "fingerprint": {...}} or {"ok": false, "error": "<message>"} (a rank
whose settings are invalid still takes part, so nobody hangs); `decide` turns the gathered payloads into the
refusal line or None, identically on every rank.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from cupyglm.backend import arithmetic as arith
from cupyglm.checkpoint.quant import HF_QUANT_FILE
from cupyglm.settings import SOURCES, Settings, SettingsError

VERSION = 5
BUILTIN_MODEL = "builtin-tiny"
PREFIX = "REFUSE rank settings: "

# Keys compared, in the order a refusal looks at them.
FIELDS: tuple[str, ...] = ("model", "backend", "arithmetic", "context", "parallel", "page_tokens", "kv_cache",
                           "kv_pages", "kv_gib", "prompt_cache_gib", "prompt_cache_disk", "prompt_cache_disk_gib",
                           "host_cache", "kv_share", "kv_host", "kv_host_gib", "mtp_drafts",
                           "memory_reserve_gib", "max_queue", "seed", "prefill_chunk", "vision", "vision_max_images",
                           "vision_image_tokens", "vision_urls", "vision_host")
# How the keys that are not settings come about (the rest: settings.SOURCES).
HOW = {"arithmetic": "the cupyglm build's ARITHMETIC version and the GPU's tensor core"}


def model_identity(model_dir: str | Path | None) -> str:
    """SHA-256 (hex) of the checkpoint's config.json bytes, followed (where present) by its quantisation file's
    name and bytes (ModelOpt's hf_quant_config.json: how the weights are quantised is part of the model); reads
    nothing else. None -> "builtin-tiny"."""
    if model_dir is None:
        return BUILTIN_MODEL
    h = hashlib.sha256(_read(Path(model_dir), "config.json", required=True))
    quant = _read(Path(model_dir), HF_QUANT_FILE, required=False)
    if quant is not None:
        h.update(f"\0{HF_QUANT_FILE}\0".encode())
        h.update(quant)
    return h.hexdigest()


def _read(model_dir: Path, name: str, required: bool) -> bytes | None:
    try:
        return (model_dir / name).read_bytes()
    except FileNotFoundError:
        if not required:
            return None
        raise SettingsError(f"--model {model_dir}: no {name} there") from None
    except OSError as e:
        raise SettingsError(f"--model {model_dir}: cannot read {name} ({e.strerror or e})") from None


def fingerprint(settings: Settings, *, backend: str | None = None, arithmetic: str | None = None) -> dict[str, Any]:
    """The fingerprint of `settings` (model identity from settings.model_id, else computed from config.json;
    arithmetic from the backend unless given)."""
    model = settings.model_id if settings.model_id is not None else model_identity(settings.model)
    backend = backend or settings.backend
    fp: dict[str, Any] = {"version": VERSION, "model": model, "backend": backend,
                          "arithmetic": arithmetic if arithmetic is not None else arith.identity(backend)}
    for name in FIELDS[3:]:
        fp[name] = settings.kv_host_mode if name == "kv_host" else getattr(settings, name)
    return fp


def fingerprint_hash(fp: dict[str, Any]) -> str:
    """SHA-256 (hex) of the fingerprint's canonical JSON; stamped into shared-memory headers."""
    return hashlib.sha256(json.dumps(fp, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _how(key: str) -> str:
    return HOW.get(key) or SOURCES.get(key, key)


def compare(fingerprints: list[dict[str, Any]]) -> str | None:
    """The refusal line for the first rank (in rank order) whose fingerprint differs from rank 0's, else None."""
    if not fingerprints:
        return None
    base = fingerprints[0]
    for rank, fp in enumerate(fingerprints[1:], start=1):
        if fp.get("version") != base.get("version"):
            return (f"{PREFIX}rank {rank}'s fingerprint version {fp.get('version')} differs from rank 0's "
                    f"{base.get('version')} (the ranks run different cupyglm builds)")
        keys = list(base) + [k for k in fp if k not in base]
        for key in keys:
            if key == "version":
                continue
            if key not in fp or key not in base or fp[key] != base[key]:
                return f"{PREFIX}rank {rank}'s {key} differs from rank 0's ({_how(key)})"
    return None


def payload_ok(fp: dict[str, Any]) -> str:
    return json.dumps({"ok": True, "fingerprint": fp}, sort_keys=True)


def payload_error(message: str) -> str:
    return json.dumps({"ok": False, "error": message}, sort_keys=True)


def decide(payloads: list[str]) -> str | None:
    """From every rank's payload (JSON text, in rank order): the one refusal line all ranks print, or None.

    A rank's invalid setting wins over differences (the lowest such rank's message), then `compare`.
    """
    decoded = []
    for rank, text in enumerate(payloads):
        try:
            p = json.loads(text)
            ok = bool(p["ok"])
        except (ValueError, KeyError, TypeError):
            return f"{PREFIX}rank {rank} sent an unreadable fingerprint (the ranks run different cupyglm builds)"
        if not ok:
            msg = str(p.get("error", "invalid settings"))
            return msg if msg.startswith("REFUSE ") else PREFIX + msg
        decoded.append(p["fingerprint"])
    return compare(decoded)
