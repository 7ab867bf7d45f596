"""Guarded worker process of the CPU emulator.

Run as a script (``python -I -S sim_worker.py LIB ARENA_FD REQ_FD RESP_FD``) by
:mod:`cupyglm.kernels.sim`; it uses the standard library only, so it never
imports the cupyglm package.  It loads one emulator library, answers a
handshake with the kernel signatures, then serves launch requests until EOF.

Arrays live in a shared memory arena (a memfd created by the parent).  Page 0
of the arena is the crash-report area written by the library's signal
handler; the parent lays out the argument buffers with PROT_NONE guard pages
between them and tells the worker which ranges to protect for each launch.
A crash kills only this process; the parent reports it as ``SimCrash``.
"""

import ctypes
import os
import pickle
import struct
import sys

PROT_NONE, PROT_READ, PROT_WRITE = 0, 1, 2
MAP_SHARED = 1
MAP_FAILED = ctypes.c_void_p(-1).value


def _read_exact(fd, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _recv(fd):
    head = _read_exact(fd, 8)
    if head is None:
        return None
    (n,) = struct.unpack("<Q", head)
    body = _read_exact(fd, n)
    return None if body is None else pickle.loads(body)


def _send(fd, obj):
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    data = struct.pack("<Q", len(data)) + data
    view = memoryview(data)
    while view:
        k = os.write(fd, view)
        view = view[k:]


def main(argv):
    lib_path, arena_fd, req_fd, resp_fd = argv[1], int(argv[2]), int(argv[3]), int(argv[4])
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

    try:
        lib = ctypes.CDLL(lib_path)
        lib.cuemu_kernel_names.restype = ctypes.c_char_p
        lib.cuemu_last_error.restype = ctypes.c_char_p
        lib.cuemu_set_order.argtypes = [ctypes.c_int, ctypes.c_ulonglong]
        lib.cuemu_set_crash_area.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t]
        names = [n for n in lib.cuemu_kernel_names().decode().split(",") if n]
        sigs, launchers = {}, {}
        for n in names:
            sf = getattr(lib, "cuemu_signature_" + n)
            sf.restype = ctypes.c_char_p
            sig = sf().decode()
            sigs[n] = sig.split("|") if sig else []
            lf = getattr(lib, "cuemu_launch_" + n)
            lf.restype = ctypes.c_int
            lf.argtypes = [ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_uint), ctypes.c_ulonglong,
                           ctypes.POINTER(ctypes.c_void_p)]
            launchers[n] = lf
    except Exception as e:  # noqa: BLE001 - reported to the parent
        _send(resp_fd, {"ok": False, "error": f"{type(e).__name__}: {e}"})
        return 1
    _send(resp_fd, {"ok": True, "kernels": sigs, "pid": os.getpid()})

    base, size, page = None, 0, os.sysconf("SC_PAGE_SIZE")
    while True:
        msg = _recv(req_fd)
        if msg is None or msg.get("op") == "exit":
            return 0
        asize = msg["arena_size"]
        if asize != size:
            if base is not None:
                libc.munmap(base, size)
            base = libc.mmap(None, asize, PROT_READ | PROT_WRITE, MAP_SHARED, arena_fd, 0)
            if base in (None, MAP_FAILED):
                _send(resp_fd, {"rc": 3, "err": f"worker: mmap of the arena failed (errno {ctypes.get_errno()})"})
                base, size = None, 0
                continue
            size = asize
            lib.cuemu_set_crash_area(base, page, base, size)
        for off, length, prot in msg["protect"]:
            libc.mprotect(base + off, length, prot)
        args = msg["args"]
        slots = (ctypes.c_uint64 * max(1, len(args)))()
        ptrs = (ctypes.c_void_p * max(1, len(args)))()
        slot_addr = ctypes.addressof(slots)
        for i, (kind, val) in enumerate(args):
            if kind == "p":
                slots[i] = base + val
            else:
                ctypes.memmove(slot_addr + 8 * i, val, len(val))
            ptrs[i] = slot_addr + 8 * i
        grid = (ctypes.c_uint * 3)(*msg["grid"])
        block = (ctypes.c_uint * 3)(*msg["block"])
        lib.cuemu_set_order(msg["order"], msg["seed"])
        rc = launchers[msg["kernel"]](grid, block, msg["smem"], ptrs)
        if msg["protect"]:
            libc.mprotect(base + page, size - page, PROT_READ | PROT_WRITE)
        _send(resp_fd, {"rc": rc, "err": lib.cuemu_last_error().decode(errors="replace") if rc else ""})


if __name__ == "__main__":
    sys.exit(main(sys.argv))
