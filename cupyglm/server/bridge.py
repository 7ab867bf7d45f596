"""The bridge between the asyncio server and the engine, which runs in a dedicated thread on rank 0.

The engine thread builds the engine (a collective with the other ranks), then loops: apply pending aborts, run
`engine.step()` while there is work, hand each step's outputs to the event loop with `call_soon_threadsafe`,
sleep on an event while idle. Each request has an asyncio queue that receives its `Delta`s; the last one has
`finished` set. Aborts are queued and applied by the engine thread itself, between steps, so the engine is
only ever stepped and aborted from one thread. If the engine thread dies every open request receives the error,
`/health` turns 503, and `on_dead` is called (the server then shuts down and the job exits non-zero).
"""
from __future__ import annotations

import asyncio
import dataclasses
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

from cupyglm.server.metrics import Metrics


@dataclasses.dataclass
class Delta:
    """One request's share of one engine step, normalized from the engine's RequestOutput."""

    request_id: int
    token_ids: list[int]
    text: str
    finished: bool
    finish_reason: str | None
    prompt_tokens: int | None
    cached_tokens: int
    cache_miss_reason: str | None = None
    logprobs: list | None = None         # per token (logprob, [(id, logprob)]) when the request asked for them
    prompt_logprobs: list | None = None  # with the first token: [(prompt token, logprob, top)] from token 1
    draft: tuple[int, int] | None = None  # (MTP drafts proposed, accepted) this step when the request drafts
    error: str | None = None             # finish_reason "error": why the engine refused the request


class EngineDied(RuntimeError):
    pass


def normalize(out) -> Delta:
    """An engine RequestOutput as the server's Delta."""
    return Delta(request_id=out.request_id, token_ids=[int(t) for t in out.new_token_ids], text=out.new_text or "",
                 finished=bool(out.finished), finish_reason=out.finish_reason, prompt_tokens=out.prompt_tokens,
                 cached_tokens=int(out.cached_tokens or 0),
                 cache_miss_reason=getattr(out, "cache_miss_reason", None), logprobs=getattr(out, "logprobs", None),
                 prompt_logprobs=getattr(out, "prompt_logprobs", None), draft=getattr(out, "draft", None),
                 error=getattr(out, "error", None))


class RequestStream:
    """The asyncio side of one request: `await next()` gives Deltas; raises EngineDied if the engine died."""

    def __init__(self, bridge: "EngineBridge", request_id: int, prompt_len: int, arrival: float):
        self.bridge = bridge
        self.request_id = request_id
        self.prompt_len = prompt_len
        self.arrival = arrival
        self.queue: asyncio.Queue = asyncio.Queue()
        self.finished = False
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.generated = 0

    async def next(self) -> Delta:
        item = await self.queue.get()
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        if item.finished:
            self.finished = True
        return item

    def abort(self) -> None:
        """Abort this request if it has not finished (client gone); its pages are freed by the engine thread."""
        if not self.finished:
            self.finished = True
            self.bridge.abort(self.request_id)


class EngineBridge:
    IDLE_WAIT_S = 0.05

    def __init__(self, loop: asyncio.AbstractEventLoop, metrics: Metrics):
        self.loop = loop
        self.metrics = metrics
        self.engine: Any = None
        self.ready = False
        self.dead: BaseException | None = None
        self.closing = False
        self._streams: dict[int, RequestStream] = {}
        self._ids = itertools.count(1)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._aborts: list[int] = []
        self._admin: list[tuple[str, asyncio.Future]] = []
        self._thread: threading.Thread | None = None
        self.on_dead: Callable[[BaseException], None] | None = None
        self.step_count = 0

    # ---- the engine thread --------------------------------------------------------------------------------------
    def start(self, factory: Callable[[], Any], on_ready: Callable[[Any], None] | None = None) -> None:
        """Build the engine with `factory()` in the engine thread, then run the loop there."""
        self._thread = threading.Thread(target=self._main, args=(factory, on_ready), name="cupyglm-engine",
                                        daemon=True)
        self._thread.start()

    def _main(self, factory: Callable[[], Any], on_ready: Callable[[Any], None] | None) -> None:
        try:
            self.engine = factory()
            self._snapshot()
            self.ready = True
            if on_ready is not None:
                on_ready(self.engine)
            self._loop()
        except BaseException as e:  # noqa: BLE001 - reported to every open request and to the server
            self.ready = False
            self.dead = e
            try:
                self.loop.call_soon_threadsafe(self._fail_all, e)
            except RuntimeError:      # the loop is closed already
                pass
            return
        try:
            self.engine.shutdown()
        except BaseException as e:  # noqa: BLE001
            self.dead = e

    def _loop(self) -> None:
        engine = self.engine
        while not self._stop.is_set():
            with self._lock:
                aborts, self._aborts = self._aborts, []
            for rid in aborts:
                engine.abort(rid)
            if aborts:
                self._snapshot()
            with self._lock:
                admin, self._admin = self._admin, []
            for op, fut in admin:
                self._run_admin(engine, op, fut)
            if engine.has_work():
                t0 = time.monotonic()
                outs = engine.step()
                t1 = time.monotonic()
                self.step_count += 1
                self._snapshot()
                if outs:
                    self.loop.call_soon_threadsafe(self._deliver, [normalize(o) for o in outs], t0, t1)
            else:
                self._wake.wait(self.IDLE_WAIT_S)
                self._wake.clear()

    def _snapshot(self) -> None:
        """KV pages as the engine has them (engine thread)."""
        self.metrics.set_pages(self.engine.free_pages, self.engine.total_pages)
        cache = getattr(self.engine, "cache_held", None)
        if cache is not None:
            self.metrics.set_cache(*cache)
        held = getattr(self.engine, "store_pages", None)
        if held is not None:
            self.metrics.store_pages.set(held)
        disk = getattr(self.engine, "disk_stats", None)
        if disk is not None:
            self.metrics.set_disk(disk)
        host = getattr(self.engine, "kv_host_stats", None)
        if host:
            self.metrics.set_kv_host(host)

    def _run_admin(self, engine, op: str, fut: asyncio.Future) -> None:
        """A cache operation between steps (engine thread); its result or ValueError goes to `fut`."""
        def settle(value, error) -> None:
            if not fut.done():
                fut.set_exception(error) if error is not None else fut.set_result(value)

        try:
            value, error = engine.cache_admin(op), None
        except ValueError as e:
            value, error = None, e
        self._snapshot()
        self.loop.call_soon_threadsafe(settle, value, error)

    def admin(self, op: str) -> asyncio.Future:
        """Queue a cache operation ("save", "clear") for the engine thread (event loop thread)."""
        if self.dead is not None:
            raise EngineDied(f"the engine stopped: {self.dead}")
        fut = self.loop.create_future()
        with self._lock:
            self._admin.append((op, fut))
        self._wake.set()
        return fut

    # ---- the event loop side ------------------------------------------------------------------------------------
    def submit(self, prompt_ids: list[int], params: Any, cache_salt: str | None = None, images=()) -> RequestStream:
        """Enqueue a request (event loop thread); the engine's QueueFull / RequestTooLong / ValueError propagate."""
        if self.dead is not None:
            raise EngineDied(f"the engine stopped: {self.dead}")
        rid = next(self._ids)
        stream = RequestStream(self, rid, len(prompt_ids), time.monotonic())
        self._streams[rid] = stream
        try:
            extra = {"cache_salt": cache_salt} if cache_salt is not None else {}
            extra |= {"images": tuple(images)} if images else {}
            self.engine.add_request(list(prompt_ids), params, request_id=rid, **extra)
        except BaseException:
            self._streams.pop(rid, None)
            raise
        self.metrics.on_arrival(len(prompt_ids))
        self._update_counts()
        self._wake.set()
        return stream

    def abort(self, request_id: int) -> None:
        stream = self._streams.pop(request_id, None)
        if stream is not None:
            self.metrics.on_finish(stream, "abort", time.monotonic())
        self._update_counts()
        with self._lock:
            self._aborts.append(request_id)
        self._wake.set()

    def _deliver(self, deltas: list[Delta], t_start: float, t_end: float) -> None:
        now = time.monotonic()
        for d in deltas:
            stream = self._streams.get(d.request_id)
            if stream is None:
                continue         # aborted meanwhile
            if d.token_ids:
                if stream.first_token_at is None:
                    stream.first_token_at = now
                    self.metrics.on_first_token(stream, max(0.0, t_start - stream.arrival), now - stream.arrival)
                else:
                    self.metrics.on_tokens(stream, now - (stream.last_token_at or now), len(d.token_ids))
                stream.last_token_at = now
                stream.generated += len(d.token_ids)
                self.metrics.generation_tokens.inc(len(d.token_ids))
            if d.draft is not None and d.draft[0]:
                self.metrics.on_draft(*d.draft)
            if d.finished:
                self._streams.pop(d.request_id, None)
                self.metrics.on_finish(stream, d.finish_reason or "stop", now, cached=d.cached_tokens)
            stream.queue.put_nowait(d)
        self._update_counts()

    def _update_counts(self) -> None:
        running = sum(1 for s in self._streams.values() if s.first_token_at is not None)
        self.metrics.set_counts(running, len(self._streams) - running)

    def _fail_all(self, exc: BaseException) -> None:
        self._fail_streams(EngineDied(f"the engine stopped: {type(exc).__name__}: {exc}"))
        if self.on_dead is not None:
            self.on_dead(exc)

    def _fail_streams(self, err: EngineDied) -> None:
        for stream in list(self._streams.values()):
            stream.queue.put_nowait(err)
        self._streams.clear()
        self._update_counts()

    def fail(self, reason: str) -> None:
        """Any thread: the job is going down (the watchdog fired). Every open request gets `reason` as its error
        (an SSE error event then [DONE] for a stream) and /health turns 503 with it; the server keeps answering."""
        err = EngineDied(reason)
        self.dead = err
        try:
            self.loop.call_soon_threadsafe(self._fail_streams, err)
        except RuntimeError:          # the loop is closed already
            pass

    @property
    def open_requests(self) -> int:
        return len(self._streams)

    async def drain(self, timeout: float) -> int:
        """Wait up to `timeout` s for open requests to finish; abort the rest. Returns how many were aborted."""
        self.closing = True
        deadline = time.monotonic() + timeout
        while self._streams and time.monotonic() < deadline and self.dead is None:
            await asyncio.sleep(0.05)
        left = list(self._streams)
        for rid in left:
            stream = self._streams.get(rid)
            if stream is not None:
                stream.queue.put_nowait(EngineDied("the server is shutting down"))
            self.abort(rid)
        return len(left)

    def stop(self, timeout: float | None = 30.0) -> None:
        """Stop the engine thread (it shuts the engine down: the stop broadcast to the other ranks) and join it."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def thread_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.dead is None


async def merge_streams(streams: list[RequestStream]):
    """(choice index, Delta) in arrival order over every choice's stream; EngineDied ends it."""
    if len(streams) == 1:
        while True:
            d = await streams[0].next()
            yield 0, d
            if d.finished:
                return
    q: asyncio.Queue = asyncio.Queue()

    async def pump(k: int, st: RequestStream) -> None:
        try:
            while True:
                d = await st.next()
                q.put_nowait((k, d))
                if d.finished:
                    return
        except EngineDied as e:
            q.put_nowait((k, e))

    tasks = [asyncio.ensure_future(pump(k, st)) for k, st in enumerate(streams)]
    try:
        left = len(streams)
        while left:
            k, d = await q.get()
            if isinstance(d, BaseException):
                raise d
            yield k, d
            left -= d.finished
    finally:
        for t in tasks:
            t.cancel()
