"""Database work for event-loop code: a few threads that keep their connections open.

Django connections belong to the thread that opened them. asgiref's `sync_to_async` runs
every call of every consumer on one shared thread and Channels' wrapper closes the connection
after each call; a connect per call (milliseconds on PostgreSQL) on one thread for the whole
process is what made storage the bottleneck. Instead, event-loop code awaits
`db_sync_to_async` functions, which run on `db_calls`: a fixed set of threads, each holding its
own connection for as long as it lives (closed only after an error, or by `stop()`). The event
log's writer is a thread of the same kind (see `craft.storage.eventlog`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from django.db import connections

logger = logging.getLogger(__name__)

T = TypeVar("T")
_STOP = object()


def close_broken_connections() -> None:
    """Close this thread's connections that an error left unusable (the next call reopens)."""
    for connection in connections.all(initialized_only=True):
        if connection.connection is not None and not connection.is_usable():
            connection.close()


class DatabaseThreads:
    """A fixed set of threads that run blocking database calls, keeping their connections.

    Started on first use; `stop()` closes their connections and ends them (the next call
    starts them again).
    """

    def __init__(self, name: str, size: int) -> None:
        self.name = name
        self.size = size
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def submit(self, func: Callable[..., T], *args: Any) -> Future[T]:
        future: Future[T] = Future()
        self._ensure_started()
        self._jobs.put((future, func, args))
        return future

    async def run(self, func: Callable[..., T], *args: Any) -> T:
        return await asyncio.wrap_future(self.submit(func, *args))

    def stop(self) -> None:
        """Close the threads' connections and end them; wait until they are gone."""
        with self._lock:
            threads, self._threads = self._threads, []
        for _ in threads:
            self._jobs.put(_STOP)
        for thread in threads:
            thread.join(10)

    def _ensure_started(self) -> None:
        if len(self._threads) == self.size:
            return
        with self._lock:
            while len(self._threads) < self.size:
                thread = threading.Thread(
                    target=self._work, name=f"{self.name}-{len(self._threads)}", daemon=True
                )
                thread.start()
                self._threads.append(thread)

    def _work(self) -> None:
        try:
            while True:
                job = self._jobs.get()
                if job is _STOP:
                    return
                future, func, args = job
                if not future.set_running_or_notify_cancel():
                    continue
                try:
                    result = func(*args)
                except BaseException as exc:
                    close_broken_connections()
                    future.set_exception(exc)
                else:
                    future.set_result(result)
        finally:
            connections.close_all()


# ORM calls of event-loop code, reads and small writes (leases, a session's title): not the
# event log's appends, which go through its writer.
db_calls = DatabaseThreads("craft-db-call", 4)


def db_sync_to_async(func: Callable[..., T]) -> Callable[..., Any]:
    """Wrap a blocking ORM function so that event-loop code can await it (on `db_calls`)."""

    @functools.wraps(func)
    async def call(*args: Any, **kwargs: Any) -> T:
        return await db_calls.run(functools.partial(func, *args, **kwargs))

    return call
