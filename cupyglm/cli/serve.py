"""cupyglm-serve: the OpenAI-compatible server. Every rank runs this; rank 0 serves HTTP.

    mpirun -n 2 cupyglm-serve [--model DIR] [--host 127.0.0.1] [--port 8000] [--api-key KEY | --api-key-file PATH]
                              [--max-body-bytes N] [shared flags: --parallel N --context N --backend ...]

Every rank parses the same flags and takes part in the settings handshake, then loads its shard. Rank 0 binds its
socket first (so a taken port fails before any weight is read), serves `/health` (503 while loading) and builds
the engine in the engine thread; the other ranks build theirs and run the worker loop in lockstep. Once loaded,
rank 0 prints one line `serving <model> at http://HOST:PORT/v1 (...)` (with --port 0, the port the system gave).
SIGTERM/SIGINT: stop accepting, drain running requests (at most --drain-seconds), stop the engine (the stop
broadcast reaches every rank), every rank confirms and exits 0; a rank that does not confirm within a few seconds
aborts the job, and so does a second signal. A rank silent or a step stuck past --step-timeout ends the job
(cupyglm.distributed.watchdog).
"""
from __future__ import annotations

import argparse
import asyncio
import ipaddress
import os
import socket
import stat
import sys
import time
from pathlib import Path

from cupyglm import settings as settings_mod
from cupyglm.settings import SettingsError

DEFAULT_PORT = 8000
DEFAULT_DRAIN_S = 10.0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cupyglm-serve", description=__doc__.splitlines()[0])
    settings_mod.add_arguments(p)
    g = p.add_argument_group("HTTP (rank 0)")
    g.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, loopback only)")
    g.add_argument("--port", default=str(DEFAULT_PORT), metavar="PORT",
                   help=f"port to bind (default {DEFAULT_PORT}; 0 = any free port, printed in the serving line)")
    k = g.add_mutually_exclusive_group()
    k.add_argument("--api-key", default=None, metavar="KEY", help="require 'Authorization: Bearer KEY'")
    k.add_argument("--api-key-file", default=None, metavar="PATH",
                   help="read the key (first line) from PATH; refused if group or others can read it")
    g.add_argument("--max-body-bytes", default=str(16 * 1024 * 1024), metavar="N",
                   help="largest request body accepted (default 16 MiB); larger ones get 413")
    g.add_argument("--served-model-name", default=None, metavar="NAME",
                   help="model id in the API (default: --model as given, or 'cupyglm-tiny')")
    g.add_argument("--read-timeout", default="10", metavar="S",
                   help="a connection's request line and headers must arrive within S seconds (default 10)")
    g.add_argument("--body-timeout", default="30", metavar="S",
                   help="a request's body must arrive within S seconds of its headers (default 30); else 408")
    g.add_argument("--allow-control-tokens", action="store_true",
                   help="special-token text in chat message content (e.g. '<|assistant|>') becomes the control "
                        "token; for trusted clients only (default: such text is plain text)")
    g.add_argument("--step-timeout", default="30", metavar="S",
                   help="liveness bound (default 30): a rank silent for S seconds, or a step of R rows running "
                        "past S*(1+R/256) seconds (10x for the first step), ends the job (exit 1, naming the rank)")
    g.add_argument("--drain-seconds", default=str(DEFAULT_DRAIN_S), metavar="S",
                   help=f"on SIGTERM, how long running requests may finish (default {DEFAULT_DRAIN_S:g})")
    return p


# ---- flag checks (each error names its flag) ---------------------------------------------------------------------

def _int_flag(flag: str, raw: str, lo: int, hi: int | None = None) -> int:
    try:
        v = int(str(raw), 10)
    except ValueError:
        raise SettingsError(f"{flag} must be an integer, got {raw!r}") from None
    if v < lo or (hi is not None and v > hi):
        raise SettingsError(f"{flag} must be in {lo}..{hi if hi is not None else ''}, got {v}")
    return v


def _float_flag(flag: str, raw: str, positive: bool = False) -> float:
    try:
        v = float(raw)
    except ValueError:
        v = -1.0
    if not v >= 0 or v == float("inf") or (positive and v == 0):
        raise SettingsError(f"{flag} must be a number of seconds {'> 0' if positive else '>= 0'}, got {raw!r}")
    return v


def read_key_file(path: str) -> str:
    """The key in `path` (first line); refused when group or others may read it, naming the file and its mode."""
    p = Path(path).expanduser()
    try:
        st = p.stat()
    except OSError as e:
        raise SettingsError(f"--api-key-file {path}: cannot read it ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise SettingsError(f"--api-key-file {path}: not a regular file")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        raise SettingsError(f"--api-key-file {path}: mode {mode:04o} lets group or others read it; "
                            f"chmod 600 {path}")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SettingsError(f"--api-key-file {path}: cannot read it ({e})") from None
    if not text.strip():
        raise SettingsError(f"--api-key-file {path}: the file is empty")
    key = text.splitlines()[0].strip()
    if not key:
        raise SettingsError(f"--api-key-file {path}: the first line is blank (the key must be on the first line)")
    return key


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise SettingsError(f"--host {host}: cannot resolve it ({e.strerror})") from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)   # asyncio sets TCP_NODELAY only then
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        raise SettingsError(f"--host {host} --port {port}: cannot bind ({e.strerror})") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


# ---- the engine ------------------------------------------------------------------------------------------------

def make_engine(world, ckpt, observers=None):
    """This rank's engine (a collective: every rank builds its own in the same order; each prints its plan line)."""
    from cupyglm.engine.build import NO_OBSERVERS, build

    engine, _plan = build(world, ckpt, observers=observers or NO_OBSERVERS)
    return engine


def _say(line: str) -> None:
    print(line, flush=True)


def serve(args: argparse.Namespace, observers=None) -> int:
    """`observers` (engine.build.Observers): what a test watches in this rank (tests/observed_serve.py)."""
    from cupyglm.backend import resolve
    from cupyglm.distributed import world as world_mod

    t0 = time.monotonic()
    # Every flag is checked on every rank before the handshake, so a bad one is refused by all ranks together.
    st = settings_mod.Settings.from_args(args)
    port = _int_flag("--port", args.port, 0, 65535)
    max_body = _int_flag("--max-body-bytes", args.max_body_bytes, 1)
    drain_s = _float_flag("--drain-seconds", args.drain_seconds)
    args.step_timeout = _float_flag("--step-timeout", args.step_timeout, positive=True)
    args.read_timeout = _float_flag("--read-timeout", args.read_timeout, positive=True)
    args.body_timeout = _float_flag("--body-timeout", args.body_timeout, positive=True)
    key = args.api_key
    if key is not None and not key.strip():
        raise SettingsError("--api-key must not be empty")
    if args.api_key_file is not None:
        key = read_key_file(args.api_key_file)
    if args.served_model_name is not None and not args.served_model_name.strip():
        raise SettingsError("--served-model-name must not be empty")

    backend, note = resolve(st.backend)
    world = world_mod.start(st, backend=backend,          # the fingerprint handshake, before any weight
                            before_map=observers.shm_before_map if observers is not None else None)
    world.settings.refuse_unavailable()
    from cupyglm.distributed import watchdog

    link = watchdog.open_link(world)                      # collective: every rank, before any weight

    if world.rank != 0:
        from cupyglm.checkpoint.loader import open_model

        box: dict = {}
        beater = watchdog.Beater(link, lambda: box["engine"].done_step if "engine" in box else -1)
        ckpt = open_model(st.model)
        engine = box["engine"] = make_engine(world, ckpt, observers)
        _say(f"rank {world.rank}: pid {os.getpid()} ready")
        engine.worker_loop()
        beater.bye()
        return 0

    sock = bind(args.host, port)
    host, bound_port = sock.getsockname()[:2]
    if not is_loopback(args.host) and key is None:
        print(f"WARNING: serving on {args.host}, which is not loopback, without an API key: anyone who can reach "
              f"this port can use the model (set --api-key or --api-key-file)", file=sys.stderr, flush=True)
    _say(f"# {note}; tp {world.size}; rank 0: pid {os.getpid()}")
    served_id = args.served_model_name or (st.model if st.model is not None else "cupyglm-tiny")
    return asyncio.run(_serve_rank0(world, link, st, sock, args, bound_port, served_id, key, max_body, drain_s,
                                    t0, observers))


async def _serve_rank0(world, link, st, sock, args, port, served_id, key, max_body, drain_s, t0,
                       observers=None) -> int:
    import uvicorn

    from cupyglm.distributed.watchdog import Watchdog
    from cupyglm.engine.sampling import SamplingParams
    from cupyglm.server.app import ServerState, create_app
    from cupyglm.server.bridge import EngineBridge
    from cupyglm.server.guards import KEEP_ALIVE_S, GuardedH11Protocol
    from cupyglm.server.metrics import Metrics

    host = args.host
    loop = asyncio.get_running_loop()
    metrics = Metrics(served_id)
    bridge = EngineBridge(loop, metrics)
    state = ServerState(bridge=bridge, metrics=metrics, served_id=served_id, root=served_id,
                        api_keys=(key.encode(),) if key else (), max_body_bytes=max_body, make_params=SamplingParams,
                        allow_control_tokens=args.allow_control_tokens, body_timeout_s=args.body_timeout)
    server_box: dict = {}
    wd = Watchdog(link, args.step_timeout, on_fire=bridge.fail)
    factory, on_ready = _engine_hooks(world, st, state, wd, loop, served_id, host, port, t0, observers)

    def on_dead(exc: BaseException) -> None:     # event loop thread
        server = server_box.get("server")
        if server is not None:
            server.should_exit = True

    bridge.on_dead = on_dead
    protocol = type("HeadTimedH11Protocol", (GuardedH11Protocol,), {"head_timeout_s": args.read_timeout})
    config = uvicorn.Config(create_app(state), http=protocol, lifespan="off", log_level="warning",
                            access_log=False, timeout_graceful_shutdown=max(drain_s, 0.1) + 5,
                            timeout_keep_alive=KEEP_ALIVE_S)
    server = _server_class()(config)
    server_box["server"] = server
    bridge.start(factory, on_ready)

    from cupyglm.distributed.failure import request_stop

    watcher = asyncio.ensure_future(_watch_stop(server, bridge, drain_s))
    try:
        await server.serve(sockets=[sock])
    finally:
        server.should_exit = True
        aborted = await watcher
        state.pool.close()
        request_stop()
        if bridge.dead is None:
            _stop_every_rank(bridge, wd, link)
        else:
            bridge.stop(timeout=5)
    if bridge.dead is not None:
        raise bridge.dead
    _say(f"stopped: {aborted} open request(s) aborted after the drain; every rank confirmed the stop")
    return 0


def _engine_hooks(world, st, state, wd, loop, served_id, host, port, t0, observers=None):
    """The bridge's engine factory (engine thread: open the checkpoint, build the engine under the watchdog) and
    its on_ready (engine thread: publish the model's info and tokenizer to `state` on the event loop)."""
    from cupyglm.checkpoint.loader import open_model
    from cupyglm.server.app import model_info

    holder: dict = {}

    def factory():
        ckpt = open_model(st.model)
        holder["ckpt"] = ckpt
        engine = make_engine(world, ckpt, observers)
        engine.watch = wd
        holder["vision"] = image_prep(ckpt, world.settings) if engine.encoder is not None else None
        return engine

    def on_ready(engine) -> None:        # engine thread
        ckpt = holder["ckpt"]
        context = engine.context
        root = str(ckpt.path)
        vision = holder["vision"]
        info = model_info(served_id, root, context, ckpt.config.vocab_size, getattr(engine, "keeps_prompts", False),
                          world.settings.mtp_drafts, world.settings.vision_max_images if vision else 0)

        def publish() -> None:
            state.root = root
            state.tokenizer = ckpt.tokenizer
            state.vision = vision
            state.info = info
            shown = f"[{host}]" if ":" in host else host
            _say(f"serving {served_id} at http://{shown}:{port}/v1 (backend {world.backend}; tp {world.size}; "
                 f"context {context}; loaded in {time.monotonic() - t0:.1f} s)")

        loop.call_soon_threadsafe(publish)

    return factory, on_ready


def image_prep(ckpt, settings):
    """The server's image side of a checkpoint with a tower: its preprocessor_config.json, checked against the
    tower's geometry, capped by --vision-image-tokens; remote URLs fetched with --vision-urls."""
    from cupyglm.server.image_fetch import Fetcher
    from cupyglm.server.images import ImagePrep
    from cupyglm.vision.processor import ProcessorConfig

    proc = ProcessorConfig.from_dir(ckpt.path).capped(settings.vision_image_tokens)
    proc.check_tower(ckpt.config.vision)
    return ImagePrep(proc, ckpt.config.vision.image_token_id, Fetcher() if settings.vision_urls else None)


async def _watch_stop(server, bridge, drain_s: float) -> int:
    """Until the server exits: a stop signal starts the drain; then drain, returning the requests aborted."""
    from cupyglm.distributed.failure import stop_requested, stop_signal_name

    # run_rank_main's handlers stay installed (the server class keeps them): the first signal sets the flag
    while not server.should_exit:
        if stop_requested():
            server.should_exit = True
            _say(f"rank 0: {stop_signal_name()}: draining {bridge.open_requests} open request(s) for at most "
                 f"{drain_s:g} s")
        await asyncio.sleep(0.1)
    bridge.closing = True
    return await bridge.drain(drain_s)


def _stop_every_rank(bridge, wd, link) -> None:
    """Stop the engine thread (its stop message reaches every rank) and wait for every rank to confirm; a rank that
    does not within STOP_CONFIRM_S ends the job (MPI Abort), saying which. A step that is still running is
    bounded by the watchdog, unless a rank is already silent: then the job ends at once."""
    from cupyglm.distributed.watchdog import HEARTBEAT_S, STOP_CONFIRM_S

    bridge.stop(timeout=STOP_CONFIRM_S)
    if bridge.thread_alive:
        silent = wd.silent_ranks(4 * HEARTBEAT_S)
        if silent:
            _say(f"rank 0: the engine did not finish its step within {STOP_CONFIRM_S:g} s of the stop and "
                 f"{', '.join(f'rank {r}' for r in silent)} is silent; aborting the job")
            link.abort(1)
        bridge.stop(timeout=None)
    missing = wd.confirm_stop()
    if missing:
        _say(f"rank 0: {', '.join(f'rank {r}' for r in missing)} did not confirm the stop within "
             f"{STOP_CONFIRM_S:g} s; aborting the job")
        link.abort(1)


def _server_class():
    import contextlib

    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server keeping run_rank_main's signal handlers (a second signal aborts the job at once)."""

        @contextlib.contextmanager
        def capture_signals(self):
            yield

    return Server


def main(argv: list[str] | None = None, observers=None) -> int:
    from cupyglm.distributed.failure import run_rank_main

    # flags are parsed inside the wrapper: a typo on one rank must bring every rank down, not hang them
    return run_rank_main(lambda: serve(build_parser().parse_args(argv), observers))


if __name__ == "__main__":
    sys.exit(main())
