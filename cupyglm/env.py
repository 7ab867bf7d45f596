"""The only reader of os.environ: every CUPYGLM_* variable (and the few outside ones we honour) is read here.

Settings validation lives in cupyglm.settings; this module only returns raw strings and paths.
"""
from __future__ import annotations

import os
from pathlib import Path

# name -> (default, meaning); README's environment table is generated from this list.
VARIABLES: dict[str, tuple[str, str]] = {
    "CUPYGLM_BACKEND": ("auto", "backend when --backend is not given: auto, numpy, sim or cuda"),
    "CUPYGLM_CACHE_DIR": ("$XDG_CACHE_HOME/cupyglm", "where the tiny checkpoint, compiled kernels and emulator builds are cached"),
    "CUPYGLM_HOST_CACHE": ("0", "alias of --host-cache; 1: the prompt-cache arena lives in pinned host memory mapped into the device"),
    "CUPYGLM_KV_SHARE": ("0", "alias of --kv-share N; N > 0: up to N kept prompts stay in the KV pool as ref-counted pages (needs --prompt-cache-gib > 0)"),
    "CUPYGLM_KV_HOST": ("0", "alias of --kv-host; 1: latent KV rows live in pinned host pages mapped into every device"),
    "CUPYGLM_KV_HOST_SHARED": ("0", "alias of --kv-host-shared; 1: ranks of one host map one /dev/shm file for the host KV pages (needs --kv-host)"),
    "CUPYGLM_KV_HOST_GIB": ("", "alias of --kv-host-gib; size of the host KV pages in GiB (needs --kv-host; default one full window)"),
    "CUPYGLM_VISION_HOST": ("0", "alias of --vision-host; 1: the vision tower's weights live in pinned host memory on rank 0, staged to the device one unit at a time into two slots"),
    "CUPYGLM_CUDA_GRAPHS": ("0", "alias of --cuda-graphs; 1: on the cuda backend, decode calls replay each layer whole (a DSA layer's FFN half alone with --kv-host) and the step's ends (embedding, lm_head) as CUDA graphs per batch bucket (no bit changes; not fingerprinted)"),
    "CUPYGLM_MEMORY_RESERVE_GIB": ("1.0", "alias of --memory-reserve-gib; memory each rank keeps free after weights, scratch and KV pages"),
    "CUPYGLM_SIM_ORDER": ("forward", "thread order of the sim backend: forward, reverse or shuffled"),
    "CUPYGLM_SIM_SEED": ("0", "seed of the sim backend's shuffled thread order"),
    "CUPYGLM_SIM_TIMEOUT": ("300", "seconds before an emulated kernel launch is reported as hung"),
    "CUPYGLM_SIM_CXX": ("g++", "C++17 compiler the emulator builds kernels with (else $CXX)"),
    "CUEMU_STACK_KB": ("64", "per-thread fiber stack of the emulator, KiB"),
    "CUPYGLM_DEBUG": ("0", "1: a failing rank prints its full traceback, not only its one error line"),
    "CUPYGLM_SHM_DIR": ("/dev/shm", "where shared host-memory segments (cupyglm-<token>-<purpose>) are made"),
}


def get(name: str) -> str | None:
    """Raw value of a documented variable, or None when unset."""
    if name not in VARIABLES:
        raise KeyError(f"undocumented environment variable {name}")
    return os.environ.get(name)


def cache_dir() -> Path:
    """Root of cupyglm's on-disk caches."""
    explicit = os.environ.get("CUPYGLM_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cupyglm"


def get_or(name: str) -> str:
    """A documented variable's value, or its default."""
    value = get(name)
    return VARIABLES[name][0] if value is None else value


def cxx() -> str:
    return os.environ.get("CUPYGLM_SIM_CXX") or os.environ.get("CXX") or "g++"


def cuda_homes() -> list[Path]:
    """CUDA toolkit roots named by CUDA_PATH / CUDA_HOME, in that order."""
    return [Path(os.environ[v]) for v in ("CUDA_PATH", "CUDA_HOME") if os.environ.get(v)]


def launcher_world() -> tuple[int, int] | None:
    """(rank, size) when started by an MPI launcher (MPICH/Hydra, Open MPI, Slurm PMI), else None."""
    for rank_var, size_var in (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                               ("PMIX_RANK", "PMIX_SIZE")):
        if rank_var in os.environ and size_var in os.environ:
            return int(os.environ[rank_var]), int(os.environ[size_var])
    return None


def table_markdown() -> str:
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    rows += [f"| `{k}` | `{d}` | {m} |" for k, (d, m) in VARIABLES.items()]
    return "\n".join(rows)
