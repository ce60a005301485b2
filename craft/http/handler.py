"""Django's ASGI handler, with each request's middleware and view run in one thread hop.

Django builds its middleware chain for ASGI from the inside out: every middleware that can
run asynchronously does, and each place where an asynchronous one meets a synchronous one
(Craft's own middleware, WhiteNoise, a synchronous view) is a hop between the event loop and
the request's thread. `MiddlewareMixin` also runs each `process_request` and
`process_response` of an asynchronous middleware on the request's thread. A request to a
synchronous view made about twenty hops, each a `call_soon_threadsafe` and a wait for the
GIL: 5-6 ms of the server's CPU for `/healthz` on a 2-core machine
(docs/history/performance-diary.md, "One thread for every agent's pipes, the handshake
first, one hop per HTTP request").

Here the chain is built as under WSGI, synchronous throughout, and the whole of it runs in
one hop to the request's thread. An asynchronous view (the revert) still works: Django runs
it on the event loop from that thread. Everything else is Django's own handler: request
parsing, disconnects, streaming responses (an asynchronous iterator streams from the loop).

The request's thread: Django gives each request a thread of its own for its synchronous
work (the `request_started` receivers, the chain, closing the response: all on one thread,
so that the database connection they share is that thread's). It starts a new thread per
request and joins it, from yet another thread, afterwards: with the 35 requests of a session
page at once, starting and joining threads was 15 % of the server's samples (py-spy,
docs/history/performance-diary.md, "The session page: the request threads kept"). Here the
threads are kept (`RequestThreads`): a request borrows one at its first call (`LentThread`),
and it goes back once everything the request gave it has run.

At most `REQUESTS_AT_ONCE` requests run their middleware and view at once: a request takes a
place once its whole body is in (a slow upload holds none) and gives it back when its response
starts (a streaming response holds none while it streams). The others wait on the event loop,
holding no thread. Without the bound, 400 session creates at once each ran on a thread of its
own, every one contending for the GIL and SQLite's lock: 4.8-8.5 s until all were created,
against 2.4-3.8 s sixteen at a time (docs/history/performance-diary.md, "Sixteen HTTP
requests at a time").
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from contextvars import ContextVar
from functools import partial
from typing import Any

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIHandler
from django.http import HttpRequest, HttpResponseBase

from craft.live.loops import PerLoop

# Threads kept for requests when idle; more run at once if more requests do.
IDLE_REQUEST_THREADS = 16
# Requests whose middleware and view run at once (see the module docstring).
REQUESTS_AT_ONCE = 16


class RequestThreads:
    """Single-thread executors lent to requests and kept for the next ones."""

    def __init__(self, keep: int = IDLE_REQUEST_THREADS) -> None:
        self.keep = keep
        self._idle: list[RequestThread] = []
        self._lock = threading.Lock()

    def borrow(self) -> RequestThread:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return RequestThread(self)

    def give_back(self, executor: RequestThread) -> None:
        """Take the executor back once what was submitted to it has run: a request whose
        client went away may leave its view running, and the next request must not queue
        behind it."""
        executor.give_back()

    def keep_or_stop(self, executor: RequestThread) -> None:
        with self._lock:
            if len(self._idle) < self.keep:
                self._idle.append(executor)
                return
        executor.shutdown(wait=False)


class RequestThread(ThreadPoolExecutor):
    """One thread, which knows whether anything submitted to it has yet to run."""

    def __init__(self, threads: RequestThreads) -> None:
        super().__init__(max_workers=1, thread_name_prefix="craft-http")
        self._lender = threads
        self._pending = 0
        self._returning = False
        self._count_lock = threading.Lock()

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        with self._count_lock:
            self._pending += 1
        future = super().submit(fn, *args, **kwargs)
        future.add_done_callback(self._ran)
        return future

    def _ran(self, _: Future[Any]) -> None:
        with self._count_lock:
            self._pending -= 1
            back = self._returning and not self._pending
            if back:
                self._returning = False
        if back:
            self._lender.keep_or_stop(self)

    def give_back(self) -> None:
        with self._count_lock:
            if self._pending:
                self._returning = True  # when the last of it has run (`_ran`)
                return
        self._lender.keep_or_stop(self)


request_threads = RequestThreads()


class LentThread(Executor):
    """A request's thread, borrowed at the request's first call (used from the event loop)."""

    def __init__(self, threads: RequestThreads) -> None:
        self._threads = threads
        self._thread: RequestThread | None = None

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        if self._thread is None:
            self._thread = self._threads.borrow()
        return self._thread.submit(fn, *args, **kwargs)

    def give_back(self) -> None:
        if self._thread is not None:
            self._threads.give_back(self._thread)
            self._thread = None


class Place:
    """A request's place among the REQUESTS_AT_ONCE, once it has one."""

    def __init__(self, places: asyncio.Semaphore) -> None:
        self._places = places
        self._held = False

    async def take(self) -> None:
        await self._places.acquire()
        self._held = True

    def give_back(self) -> None:
        if self._held:
            self._held = False
            self._places.release()


_places: PerLoop[asyncio.Semaphore] = PerLoop(lambda loop: asyncio.Semaphore(REQUESTS_AT_ONCE))
_place: ContextVar[Place] = ContextVar("craft_request_place")


def _bounded(receive: Any, limit: int) -> Callable[[], Awaitable[Any]]:
    """Return `receive`, raising BodyTooLarge once the body's bytes pass `limit`."""
    read = 0

    async def bounded() -> Any:
        nonlocal read
        message = await receive()
        read += len(message.get("body", b""))
        if read > limit:
            raise BodyTooLarge
        return message

    return bounded


async def _sending(place: Place, send: Callable[[Any], Awaitable[None]], message: Any) -> None:
    if message["type"] == "http.response.start":
        place.give_back()  # what is left is the response's bytes (a stream's too)
    await send(message)


class BodyTooLarge(Exception):
    """A request's body is over CRAFT_UPLOAD_MAX_BYTES."""


def _declared_length(scope: dict[str, Any]) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class OneHopASGIHandler(ASGIHandler):
    async def handle(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Django's, with bodies bounded: one over CRAFT_UPLOAD_MAX_BYTES is answered 413 as
        soon as its size is known (its Content-Length, or what was read), and the rest of it
        is not read (Django would spool any body whole to disk before any view runs)."""
        declared = _declared_length(scope)
        try:
            if declared is not None and declared > settings.CRAFT_UPLOAD_MAX_BYTES:
                raise BodyTooLarge
            await super().handle(scope, receive, send)
        except BodyTooLarge:
            limit = settings.CRAFT_UPLOAD_MAX_BYTES
            body = json.dumps({"error": {"code": "too_large", "message": (
                f"the request is larger than the {limit} bytes this server takes"
            )}}).encode()  # fmt: skip
            headers = [(b"content-type", b"application/json"), (b"connection", b"close"),
                       (b"content-length", str(len(body)).encode())]  # fmt: skip
            await send({"type": "http.response.start", "status": 413, "headers": headers})
            await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        place = Place(_places.here())
        token = _place.set(place)
        thread = LentThread(request_threads)
        try:
            async with ThreadSensitiveContext(executor=thread):
                await self.handle(scope, receive, partial(_sending, place, send))
        finally:
            place.give_back()
            thread.give_back()
            _place.reset(token)

    async def read_body(self, receive: Any) -> Any:
        """Read the whole body (at most CRAFT_UPLOAD_MAX_BYTES), then wait for a place (see
        the module docstring)."""
        body = await super().read_body(_bounded(receive, settings.CRAFT_UPLOAD_MAX_BYTES))
        try:
            await _place.get().take()
        except BaseException:
            body.close()
            raise
        return body

    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        # `get_response` is the synchronous path: the URL resolver, the chain, the closers and
        # the logging of an error answer, as `get_response_async` does them.
        response: HttpResponseBase = await sync_to_async(self.get_response, thread_sensitive=True)(
            request
        )
        return response
