"""The shared memory arena of a `sim` launch: argument buffers between PROT_NONE guard pages, copied in and out,
and the crash report that names the buffer a bad address falls in.

Layout: [crash page][guard][..data|][guard][..data|][guard]...; each buffer ends flush with the guard after it, so
writing one byte past the end faults.  Buffers that are read-only in numpy or bound to a ``const T*`` parameter are
mapped read-only.
"""

from __future__ import annotations

import mmap
from typing import Any, Sequence

import numpy as np

from cupyglm import env

from .sim_errors import SimLaunchError

PAGE = mmap.PAGESIZE


def round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


def layout(sig: list[str], args: Sequence[Any]):
    """(regions, msg_args, protect, total): where each buffer goes, the worker's arguments, the page protections."""
    regions: list[dict] = []
    msg_args: list[tuple[str, Any]] = []
    protect: list[tuple[int, int, int]] = []
    cursor = PAGE  # page 0: crash report
    for i, (ctype, a) in enumerate(zip(sig, args)):
        if not ctype.endswith("*"):
            msg_args.append(("s", a.tobytes()))
            continue
        is_const = ctype.startswith("const ")
        # Same buffer passed twice: share one region (aliasing preserved).
        same = next(
            (r for r in regions
             if r["array"].__array_interface__["data"][0] == a.__array_interface__["data"][0]
             and r["array"].nbytes == a.nbytes),
            None,
        )
        if same is not None:
            same["writable"] = same["writable"] or (not is_const and a.flags.writeable)
            same["copy_back"] = same["writable"] and a.flags.writeable and same["array"].flags.writeable
            msg_args.append(("p", same["off"]))
            continue
        for r in regions:
            if np.may_share_memory(r["array"], a):
                raise SimLaunchError(
                    f"parameter {i}: partially overlapping arrays are not supported by the emulator"
                )
        span = round_up(max(a.nbytes, 1), PAGE)
        protect.append((cursor, PAGE, 0))  # guard page before
        data_end = cursor + PAGE + span
        off = data_end - round_up(a.nbytes, 16)
        writable = (not is_const) and a.flags.writeable
        regions.append({"index": i, "array": a, "off": off, "start": cursor + PAGE, "end": data_end,
                        "writable": writable, "copy_back": writable})
        msg_args.append(("p", off))
        cursor = data_end
    protect.append((cursor, PAGE, 0))  # guard after the last buffer
    total = cursor + PAGE
    for r in regions:
        if not r["writable"]:
            protect.append((r["start"], r["end"] - r["start"], 1))  # PROT_READ
    return regions, msg_args, protect, total


def copy_in(arena: np.ndarray, regions: list[dict]) -> None:
    arena[:PAGE] = 0  # crash report area
    for region in regions:
        a = region["array"]
        if a.nbytes:
            arena[region["off"] : region["off"] + a.nbytes] = a.reshape(-1).view(np.uint8)


def copy_back(arena: np.ndarray, regions: list[dict]) -> None:
    for region in regions:
        if region["copy_back"]:
            a = region["array"]
            a.reshape(-1).view(np.uint8)[:] = arena[region["off"] : region["off"] + a.nbytes]


def crash_report(arena: np.ndarray) -> str:
    """What the library's signal handler wrote into page 0 (``key=value;...``)."""
    return bytes(arena[:PAGE]).split(b"\0", 1)[0].decode(errors="replace")


def crash_message(kernel: str, names: Sequence[str], path: Any, death: str, report: str, regions: list[dict],
                  smem: int) -> str:
    info = dict(kv.split("=", 1) for kv in report.split(";") if "=" in kv)
    where = ""
    if "block" in info:
        where += f" in block ({info['block']})"
    if "thread" in info:
        where += f" thread ({info['thread']})"
    detail = ""
    if "stack_overflow" in info:
        kb = env.get_or("CUEMU_STACK_KB")
        detail = f"fiber stack overflow (per-thread stack is {kb} KiB; set CUEMU_STACK_KB to raise it)"
    elif "arena_off" in info:
        off = int(info["arena_off"])
        for r in regions:
            i = r["index"]
            pname = names[i] if i < len(names) else f"arg{i}"
            a = r["array"]
            if r["start"] - PAGE <= off < r["start"]:
                detail = f"address is {r['off'] - off} bytes before parameter {i} '{pname}' (guard page)"
            elif r["end"] <= off < r["end"] + PAGE:
                detail = (f"address is {off - (r['off'] + a.nbytes)} bytes past the end of parameter {i} "
                          f"'{pname}' ({a.nbytes} bytes): out-of-bounds access")
            elif r["off"] <= off < r["end"] and not r["writable"]:
                detail = f"write into read-only parameter {i} '{pname}' (const pointer or read-only array)"
            elif r["start"] <= off < r["off"]:
                detail = f"address is {r['off'] - off} bytes before parameter {i} '{pname}'"
            if detail:
                break
    elif "dyn_smem_off" in info:
        detail = f"dynamic shared memory access at byte {info['dyn_smem_off']} (shared_mem={smem})"
    elif "addr" in info and int(info["addr"], 16) < 65536:
        detail = f"null pointer dereference (address {info['addr']})"
    elif "addr" in info:
        detail = f"bad address {info['addr']}"
    elif death == "SIGILL":
        detail = "illegal instruction (__trap() or __builtin_trap)"
    elif death == "SIGABRT":
        detail = "abort (failed assert?)"
    msg = f"kernel {kernel} crashed with {death}{where}"
    return msg + (f": {detail}" if detail else "") + f" [{path}]"
