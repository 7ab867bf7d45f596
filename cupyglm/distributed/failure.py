"""Failure and shutdown for rank processes: no rank is left hanging.

`run_rank_main(fn)` wraps a CLI main:

- an exception on a rank prints one line, `rank N: <Type>: message` (the traceback too with CUPYGLM_DEBUG=1), and
  brings every rank down with `MPI.COMM_WORLD.Abort(1)` (MPICH's Hydra kills the job within about a second). A
  rank other than 0 waits a moment before printing, so an error every rank hits is printed once, by rank 0.
- a SettingsError prints its one `REFUSE ...` line without a traceback. Raised before the handshake (an invalid
  flag or variable on this rank), the rank still takes part in the handshake, so every rank refuses together.
  An agreed one (a fingerprint refusal, refuse_unavailable) is printed by rank 0 and every rank exits 1.
- SystemExit with a non-zero status (argparse's usage error included) aborts the job too: a rank that leaves,
  even before MPI_Init, would leave the others waiting. So parse flags inside `fn`.
- SIGTERM and SIGINT set a stop flag (`stop_requested()`); Hydra forwards both to every rank. The lockstep loop
  acts on rank 0's flag (its step message carries `stop`), so all ranks leave the same step and exit 0. A second
  signal aborts the whole job at once (MPI Abort), saying so.
"""
from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from cupyglm import env
from cupyglm.settings import SettingsError

NONROOT_PRINT_DELAY_S = 1.0
OUTPUT_GRACE_S = 0.5
AGREED_EXIT_TIMEOUT_S = 8.0

_stop = {"requested": False, "signal": 0}


def stop_requested() -> bool:
    return _stop["requested"]


def stop_signal_name() -> str:
    """The signal that asked for the stop ("SIGTERM", "SIGINT"), or "stop" when none did."""
    return signal.Signals(_stop["signal"]).name if _stop["signal"] else "stop"


def request_stop() -> None:
    _stop["requested"] = True


def _on_signal(signum: int, frame: Any) -> None:
    if _stop["requested"]:
        _abort_now(signum)
    _stop["requested"] = True
    _stop["signal"] = signum


def _abort_now(signum: int) -> None:
    """A second SIGTERM/SIGINT: say so and end the whole job at once (MPI Abort when MPI is up)."""
    mpi = _mpi_if_initialized()
    rank = mpi[1] if mpi else 0
    _say(f"rank {rank}: second {signal.Signals(signum).name}: aborting the job at once")
    if mpi is not None and mpi[2] > 1:
        abort(mpi[0], 128 + signum)
    os._exit(128 + signum)


def abort(comm: Any, code: int) -> None:
    """End the whole job (MPI Abort), first unlinking MPICH's segments this rank maps: no Finalize will."""
    from cupyglm.distributed import mpich_shm

    mpich_shm.unlink_mapped()
    comm.Abort(code)


def install_signal_handlers() -> None:
    """SIGTERM/SIGINT request a clean stop (a second one exits at once). Main thread only."""
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)


def _mpi_world() -> tuple[Any, int, int] | None:
    """(COMM_WORLD, rank, size) when launched by MPI (initializing MPI if needed), else None."""
    launched = env.launcher_world()
    if launched is None:
        return None
    from mpi4py import MPI

    w = MPI.COMM_WORLD
    return w, w.Get_rank(), w.Get_size()


def _mpi_if_initialized() -> tuple[Any, int, int] | None:
    if env.launcher_world() is None or "mpi4py.MPI" not in sys.modules:
        return None
    from mpi4py import MPI

    if not MPI.Is_initialized() or MPI.Is_finalized():
        return None
    w = MPI.COMM_WORLD
    return w, w.Get_rank(), w.Get_size()


def _say(line: str) -> None:
    sys.stdout.flush()
    print(line, file=sys.stderr, flush=True)


def _debug() -> bool:
    return (env.get("CUPYGLM_DEBUG") or "0") not in ("", "0")


def _exit_agreed(line: str, mpi: tuple[Any, int, int] | None) -> int:
    """Every rank holds the same refusal: rank 0 prints it, all leave together with exit status 1."""
    if mpi is None or mpi[2] == 1:
        _say(line)
        return 1
    w, rank, _ = mpi
    if rank == 0:
        _say(line)
    req = w.Ibarrier()
    deadline = time.monotonic() + AGREED_EXIT_TIMEOUT_S
    while not req.Test():
        if time.monotonic() > deadline:
            if rank != 0:
                _say(line)
            abort(w, 1)
        time.sleep(0.005)
    return 1


def _exit_failure(line: str, mpi: tuple[Any, int, int] | None, code: int = 1) -> int:
    """This rank failed alone (as far as it knows): print, then take the whole job down."""
    if mpi is None or mpi[2] == 1:
        _say(line)
        return code
    w, rank, _ = mpi
    if rank != 0:
        time.sleep(NONROOT_PRINT_DELAY_S)
    _say(line)
    time.sleep(OUTPUT_GRACE_S)      # let the launcher forward the line before Abort tears the job down
    abort(w, code)
    return code  # not reached


def run_rank_main(fn: Callable[[], Any], *, signals: bool = True) -> int:
    """Run a rank's main; returns the exit status (0 on success or a clean stop). Use: sys.exit(run_rank_main(main))."""
    if signals:
        install_signal_handlers()
    try:
        result = fn()
        return result if isinstance(result, int) else 0
    except SettingsError as e:
        from cupyglm.distributed import world

        if _debug():
            traceback.print_exc()
        mpi = _mpi_if_initialized()
        if env.launcher_world() is not None and not world.handshake_done():
            mpi = _mpi_world()
            if mpi is not None and mpi[2] > 1:
                return _exit_agreed(world.join_handshake_with_error(e), mpi)
        if e.agreed or mpi is None:
            return _exit_agreed(e.line, mpi)
        return _exit_failure(e.line, mpi)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if code == 0:
            return 0
        if e.code is not None and not isinstance(e.code, int):
            _say(str(e.code))
        # Under a launcher, a rank that leaves (even before MPI_Init, e.g. argparse) leaves the others waiting.
        launched = env.launcher_world()
        if launched is not None and launched[1] > 1:
            mpi = _mpi_if_initialized() or _mpi_world()
            if mpi is not None:
                abort(mpi[0], code)
        return code
    except KeyboardInterrupt:
        mpi = _mpi_if_initialized()
        rank = mpi[1] if mpi else 0
        return _exit_failure(f"rank {rank}: interrupted", mpi, 130)
    except BaseException as e:  # noqa: BLE001 - every failure ends the job
        mpi = _mpi_if_initialized() or _mpi_world()
        rank = mpi[1] if mpi else 0
        if _debug():
            traceback.print_exc()
        return _exit_failure(f"rank {rank}: {type(e).__name__}: {e}", mpi)
