"""Settings: every serve/generate setting, from flags and the environment, in one frozen dataclass.

Flags come from `add_arguments` (settings_flags.py); environment variables are read through `cupyglm.env.get`
only. The settings that change the memory plan have a flag and an environment alias (MEMORY_FLAGS); the flag
wins. Every invalid value raises `SettingsError` naming the flag or variable that set it. Features that are validated but not built
yet, and combinations that cannot work, are refused by name in `Settings.refuse_unavailable()`, called after the
rank handshake; nothing is accepted and ignored.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Collection
from typing import Any

from cupyglm import env
from cupyglm.settings_flags import add_arguments

BACKENDS = ("auto", "numpy", "sim", "cuda")
KV_CACHE_DTYPES = ("bf16", "fp8")
MAX_MTP_DRAFTS = 15

# How each fingerprinted setting is set; the rank handshake names it in its refusal line.
SOURCES: dict[str, str] = {
    "model": "--model",
    "backend": "--backend or CUPYGLM_BACKEND",
    "context": "--context",
    "parallel": "--parallel",
    "page_tokens": "--page-tokens",
    "kv_cache": "--kv-cache",
    "kv_pages": "--kv-pages",
    "kv_gib": "--kv-gib",
    "prompt_cache_gib": "--prompt-cache-gib",
    "host_cache": "--host-cache or CUPYGLM_HOST_CACHE",
    "prompt_cache_disk": "--prompt-cache-dir",
    "prompt_cache_dir": "--prompt-cache-dir (not compared: the directory may differ per host)",
    "prompt_cache_disk_gib": "--prompt-cache-disk-gib",
    "kv_share": "--kv-share or CUPYGLM_KV_SHARE",
    "kv_host": "--kv-host or CUPYGLM_KV_HOST or --kv-host-shared or CUPYGLM_KV_HOST_SHARED",
    "kv_host_shared": "--kv-host-shared or CUPYGLM_KV_HOST_SHARED",
    "kv_host_gib": "--kv-host-gib or CUPYGLM_KV_HOST_GIB",
    "mtp_drafts": "--mtp-drafts",
    "memory_reserve_gib": "--memory-reserve-gib or CUPYGLM_MEMORY_RESERVE_GIB",
    "max_queue": "--max-queue",
    "seed": "--seed",
    "prefill_chunk": "--prefill-chunk",
    "cuda_graphs": "CUPYGLM_CUDA_GRAPHS or --cuda-graphs (not compared: a replay computes the eager call's bits)",
    "vision": "--vision or --no-vision",
    "vision_max_images": "--vision-max-images",
    "vision_image_tokens": "--vision-image-tokens",
    "vision_urls": "--vision-urls",
    "vision_host": "--vision-host or CUPYGLM_VISION_HOST",
}

# The settings that change the memory plan: field -> (flag, environment alias). The flag wins over the alias.
MEMORY_FLAGS: dict[str, tuple[str, str]] = {
    "host_cache": ("--host-cache", "CUPYGLM_HOST_CACHE"),
    "kv_share": ("--kv-share", "CUPYGLM_KV_SHARE"),
    "kv_host": ("--kv-host", "CUPYGLM_KV_HOST"),
    "kv_host_shared": ("--kv-host-shared", "CUPYGLM_KV_HOST_SHARED"),
    "kv_host_gib": ("--kv-host-gib", "CUPYGLM_KV_HOST_GIB"),
    "memory_reserve_gib": ("--memory-reserve-gib", "CUPYGLM_MEMORY_RESERVE_GIB"),
    "vision_host": ("--vision-host", "CUPYGLM_VISION_HOST"),
    "cuda_graphs": ("--cuda-graphs", "CUPYGLM_CUDA_GRAPHS"),
}

# Features validated and fingerprinted but not built yet: name -> why it is refused.
UNAVAILABLE: dict[str, str] = {
    "kv_cache_fp8": "fp8 KV is not available yet",
}


class SettingsError(ValueError):
    """A setting that is invalid, disagrees across ranks, or is not available; its message names the flag or variable.

    `agreed` is True when every rank raises the same error (it depends only on settings the ranks agreed on), so
    one rank prints it and all exit together.
    """

    def __init__(self, message: str, *, agreed: bool = False):
        super().__init__(message)
        self.agreed = agreed

    @property
    def line(self) -> str:
        """The one line printed for this error."""
        msg = str(self)
        return msg if msg.startswith("REFUSE ") else f"REFUSE rank settings: {msg}"


# ---- parsing helpers: each names its source (a flag or a variable) ---------------------------------------------

def _int(label: str, raw: Any, lo: int, hi: int | None = None, what: str = "") -> int:
    if isinstance(raw, bool):
        raise SettingsError(f"{label} must be an integer, got {raw!r}")
    if isinstance(raw, int):
        value = raw
    else:
        try:
            value = int(str(raw).strip(), 10)
        except ValueError:
            raise SettingsError(f"{label} must be an integer, got {str(raw)!r}") from None
    if value < lo or (hi is not None and value > hi):
        rng = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise SettingsError(f"{label} must be {what or 'an integer'} {rng}, got {value}")
    return value


def _float(label: str, raw: Any, *, positive: bool) -> float:
    try:
        value = float(raw) if isinstance(raw, (int, float)) and not isinstance(raw, bool) else float(str(raw).strip())
    except ValueError:
        value = math.nan
    kind = "a positive number" if positive else "a number >= 0"
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        shown = repr(raw) if isinstance(raw, str) else str(raw)
        raise SettingsError(f"{label} must be {kind}, got {shown}")
    return value


def env_bool(name: str) -> bool:
    """A 0/1 environment variable (unset or empty: False)."""
    raw = env.get(name)
    if raw is None or raw == "":
        return False
    if raw in ("0", "1"):
        return raw == "1"
    raise SettingsError(f"{name} must be 0 or 1, got {raw!r}")


def _choice(label: str, raw: Any, choices: tuple[str, ...]) -> str:
    value = str(raw)
    if value not in choices:
        raise SettingsError(f"{label} must be one of {', '.join(choices)}, got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class Settings:
    """Every setting of a serve/generate run; frozen. Build with `Settings.from_args` (flags + environment)."""

    model: str | None = None              # checkpoint dir; None = the built-in tiny checkpoint
    model_id: str | None = None           # hash of config.json (fingerprint.model_identity), filled by world.start
    backend: str = "auto"                 # auto|numpy|sim|cuda
    context: int = 0                      # tokens a sequence may hold; 0 = the largest that fits
    parallel: int = 4                     # concurrent streams
    page_tokens: int = 0                  # KV page size; 0 = the model's default, else a multiple of 4
    kv_cache: str = "bf16"                # bf16|fp8
    kv_pages: int = 0                     # KV pages; 0 = from the memory plan
    kv_gib: float | None = None           # explicit KV budget on CPU backends
    prompt_cache_gib: float = 0.0         # prompt-cache budget; 0 = no prompt cache
    prompt_cache_dir: str | None = None   # where kept states spill to disk (per rank files); None = no disk tier
    prompt_cache_disk_gib: float = 16.0   # disk budget of the spilled states (each rank's files)
    host_cache: bool = False              # CUPYGLM_HOST_CACHE
    kv_share: int = 0                     # CUPYGLM_KV_SHARE: most kept prompts held as KV pool pages; 0 = off
    kv_host: bool = False                 # CUPYGLM_KV_HOST
    kv_host_shared: bool = False          # CUPYGLM_KV_HOST_SHARED (needs kv_host)
    kv_host_gib: float | None = None      # CUPYGLM_KV_HOST_GIB (needs kv_host); None = one full window
    mtp_drafts: int = 0                   # MTP draft tokens per step, 0..15
    memory_reserve_gib: float = 1.0       # CUPYGLM_MEMORY_RESERVE_GIB
    max_queue: int = 256                  # waiting requests before 429
    seed: int = 0                         # default sampling seed
    prefill_chunk: int = 0                # prompt tokens per step (a multiple of the keep grid); 0 = default
    cuda_graphs: bool | None = None       # --cuda-graphs (cuda only; not compared); None: CUPYGLM_CUDA_GRAPHS decides
    vision: bool | None = None            # image parts served; None: on when the checkpoint has a vision tower
    vision_max_images: int = 4            # images one request may hold
    vision_image_tokens: int = 0          # most tokens one image gives (larger ones resized); 0: the checkpoint's
    vision_urls: bool = False             # remote http(s) image URLs fetched (server.image_fetch)
    vision_host: bool = False             # CUPYGLM_VISION_HOST: the tower's weights in host memory, staged per unit

    def __post_init__(self) -> None:
        # Direct construction gets the same checks as from_args, named by flag or variable.
        _choice(SOURCES["backend"].split(" or ")[0], self.backend, BACKENDS)
        _int("--context", self.context, 0)
        _int("--parallel", self.parallel, 1)
        _check_page_tokens("--page-tokens", self.page_tokens)
        _choice("--kv-cache", self.kv_cache, KV_CACHE_DTYPES)
        _int("--kv-pages", self.kv_pages, 0)
        if self.kv_gib is not None:
            _float("--kv-gib", self.kv_gib, positive=True)
        _float("--prompt-cache-gib", self.prompt_cache_gib, positive=False)
        _float("--prompt-cache-disk-gib", self.prompt_cache_disk_gib, positive=True)
        if self.prompt_cache_dir is not None:
            if not str(self.prompt_cache_dir).strip():
                raise SettingsError("--prompt-cache-dir must be a directory, got ''")
            if self.prompt_cache_gib <= 0:
                raise SettingsError("--prompt-cache-dir needs --prompt-cache-gib > 0 (states spill to disk from the "
                                    "memory prompt cache)")
        _int("--mtp-drafts", self.mtp_drafts, 0, MAX_MTP_DRAFTS)
        _float("CUPYGLM_MEMORY_RESERVE_GIB", self.memory_reserve_gib, positive=False)
        _int("--max-queue", self.max_queue, 0)
        _int("--seed", self.seed, 0, 2**64 - 1)
        _int("--prefill-chunk", self.prefill_chunk, 0)
        _int("--vision-max-images", self.vision_max_images, 1)
        _int("--vision-image-tokens", self.vision_image_tokens, 0)
        _int("CUPYGLM_KV_SHARE", self.kv_share, 0)
        if self.kv_host_shared and not self.kv_host:
            raise SettingsError("CUPYGLM_KV_HOST_SHARED=1 needs CUPYGLM_KV_HOST=1")
        if self.kv_host_gib is not None:
            _float("CUPYGLM_KV_HOST_GIB", self.kv_host_gib, positive=True)
            if not self.kv_host:
                raise SettingsError("CUPYGLM_KV_HOST_GIB needs CUPYGLM_KV_HOST=1")

    # ---- building ------------------------------------------------------------------------------------------------
    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> "Settings":
        """Settings from parsed flags (add_arguments) and the environment; SettingsError names the source."""
        def flag(name: str, default: Any) -> Any:
            value = getattr(ns, name, None)
            return default if value is None else value

        model = flag("model", None)
        if model is not None:
            model = str(model)
            if not model.strip():
                raise SettingsError("--model must be a checkpoint directory, got ''")

        backend_flag = getattr(ns, "backend", None)
        if backend_flag is not None:
            backend = _choice("--backend", backend_flag, BACKENDS)
        else:
            raw = env.get("CUPYGLM_BACKEND")
            backend = _choice("CUPYGLM_BACKEND", raw, BACKENDS) if raw else "auto"

        context = _int("--context", flag("context", 0), 0)
        parallel = _int("--parallel", flag("parallel", 4), 1)
        page_tokens = _check_page_tokens("--page-tokens", flag("page_tokens", 0))
        kv_cache = _choice("--kv-cache", flag("kv_cache", "bf16"), KV_CACHE_DTYPES)
        kv_pages = _int("--kv-pages", flag("kv_pages", 0), 0)
        kv_gib_raw = getattr(ns, "kv_gib", None)
        kv_gib = None if kv_gib_raw is None else _float("--kv-gib", kv_gib_raw, positive=True)
        prompt_cache_gib = _float("--prompt-cache-gib", flag("prompt_cache_gib", 0.0), positive=False)
        prompt_cache_dir = getattr(ns, "prompt_cache_dir", None)
        disk_gib_raw = getattr(ns, "prompt_cache_disk_gib", None)
        if disk_gib_raw is not None and prompt_cache_dir is None:
            raise SettingsError("--prompt-cache-disk-gib needs --prompt-cache-dir")
        prompt_cache_disk_gib = _float("--prompt-cache-disk-gib", 16.0 if disk_gib_raw is None else disk_gib_raw,
                                       positive=True)
        mtp_drafts = _int("--mtp-drafts", flag("mtp_drafts", 0), 0, MAX_MTP_DRAFTS)
        max_queue = _int("--max-queue", flag("max_queue", 256), 0)
        seed = _int("--seed", flag("seed", 0), 0, 2**64 - 1)
        prefill_chunk = _int("--prefill-chunk", flag("prefill_chunk", 0), 0)

        return cls(model=model, backend=backend, context=context, parallel=parallel, page_tokens=page_tokens,
                   kv_cache=kv_cache, kv_pages=kv_pages, kv_gib=kv_gib, prompt_cache_gib=prompt_cache_gib,
                   prompt_cache_dir=None if prompt_cache_dir is None else str(prompt_cache_dir),
                   prompt_cache_disk_gib=prompt_cache_disk_gib, mtp_drafts=mtp_drafts, max_queue=max_queue,
                   seed=seed, prefill_chunk=prefill_chunk, vision=getattr(ns, "vision", None),
                   vision_max_images=_int("--vision-max-images", flag("vision_max_images", 4), 1),
                   vision_image_tokens=_int("--vision-image-tokens", flag("vision_image_tokens", 0), 0),
                   vision_urls=bool(getattr(ns, "vision_urls", False)),
                   **_memory_settings(ns))

    @classmethod
    def from_argv(cls, argv: list[str]) -> "Settings":
        """Settings from a command line of the shared flags only (tests, the offline API)."""
        parser = argparse.ArgumentParser(add_help=False)
        add_arguments(parser)
        return cls.from_args(parser.parse_args(argv))

    # ---- facts ---------------------------------------------------------------------------------------------------
    @property
    def kv_host_mode(self) -> int:
        """0: device KV rows; 1: host KV rows per rank; 2: host KV rows shared by the ranks of a host."""
        return 2 if self.kv_host_shared else (1 if self.kv_host else 0)

    @property
    def prompt_cache_disk(self) -> bool:
        """Whether kept states spill to disk (the directory itself differs per host and is not compared)."""
        return self.prompt_cache_dir is not None

    @staticmethod
    def how_set(name: str) -> str:
        """How a fingerprinted setting is set: its flag and/or environment variable names."""
        return SOURCES[name]

    def refuse_unavailable(self, available: Collection[str] = ()) -> None:
        """Refuse, by name, a requested feature that is not built yet (keys of UNAVAILABLE not in `available`)."""
        def refuse(feature: str, setting: str) -> None:
            if feature not in available:
                raise SettingsError(f"{setting}: {UNAVAILABLE[feature]}", agreed=True)

        if self.kv_host and self.kv_cache == "fp8":
            raise SettingsError("CUPYGLM_KV_HOST=1 with --kv-cache fp8: host KV rows are bf16 latent rows on "
                                "pages (use --kv-cache bf16)", agreed=True)
        if self.kv_cache == "fp8":
            refuse("kv_cache_fp8", "--kv-cache fp8")
        if self.kv_share and not self.prompt_cache_gib:
            raise SettingsError(f"CUPYGLM_KV_SHARE={self.kv_share} needs a prompt cache (--prompt-cache-gib > 0): a "
                                f"kept prompt's fixed parts and its last, partly filled page live there", agreed=True)
        if self.kv_share and self.kv_host:
            raise SettingsError(f"CUPYGLM_KV_SHARE={self.kv_share} with CUPYGLM_KV_HOST=1: kept prompts share "
                                f"device KV pages, and with host KV rows the latent rows are not on those pages",
                                agreed=True)
        if self.kv_share and self.prompt_cache_dir is not None:
            raise SettingsError(f"CUPYGLM_KV_SHARE={self.kv_share} with --prompt-cache-dir: a state file holds a "
                                f"whole kept state, and with shared pages its rows before the keep point live in "
                                f"the KV pool, not in the kept state", agreed=True)


def _memory_settings(ns: argparse.Namespace) -> dict[str, Any]:
    """The MEMORY_FLAGS settings from their flags, else their environment aliases; an error names the one used."""
    def given(field: str) -> tuple[Any, str]:
        flag, var = MEMORY_FLAGS[field]
        value = getattr(ns, field, None)
        if value is not None:
            return value, flag
        raw = env.get(var)
        return (None if raw in (None, "") else raw), var

    def boolean(field: str) -> tuple[bool, str]:
        raw, label = given(field)
        return (bool(raw), label) if label.startswith("--") else (env_bool(label), f"{label}=1")

    def needs_kv_host(label: str) -> None:
        raise SettingsError(f"{label} needs {'--kv-host' if label.startswith('--') else 'CUPYGLM_KV_HOST=1'}")

    # cuda_graphs stays None without its flag: engine.build.cuda_graphs reads the alias, as for direct Settings
    out: dict[str, Any] = {"host_cache": boolean("host_cache")[0], "kv_host": boolean("kv_host")[0],
                           "vision_host": boolean("vision_host")[0], "cuda_graphs": getattr(ns, "cuda_graphs", None)}
    raw, label = given("kv_share")
    out["kv_share"] = _int(label, 0 if raw is None else raw, 0)
    out["kv_host_shared"], label = boolean("kv_host_shared")
    if out["kv_host_shared"] and not out["kv_host"]:
        needs_kv_host(label)
    raw, label = given("kv_host_gib")
    out["kv_host_gib"] = None if raw is None else _float(label, raw, positive=True)
    if raw is not None and not out["kv_host"]:
        needs_kv_host(label)
    raw, label = given("memory_reserve_gib")
    default = env.VARIABLES["CUPYGLM_MEMORY_RESERVE_GIB"][0]
    out["memory_reserve_gib"] = _float(label, default if raw is None else raw, positive=False)
    return out


def _check_page_tokens(label: str, raw: Any) -> int:
    value = _int(label, raw, 0)
    if value % 4:
        raise SettingsError(f"{label} must be 0 (the model's default) or a positive multiple of 4, got {value}")
    return value
