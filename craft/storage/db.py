"""Database work for event-loop code: a few threads that keep their connections open.

Django connections belong to the thread that opened them. asgiref's `sync_to_async` runs
every call of every consumer on one shared thread and Channels' wrapper closes the connection
after each call; a connect per call (milliseconds on PostgreSQL) on one thread for the whole
process is what made storage the bottleneck. Instead, event-loop code awaits
`db_sync_to_async` functions, which run on `db_calls`: a fixed set of threads, each holding its
own connection for as long as it lives (closed only after an error, or by `stop()`). The event
log's writer is a thread of the same kind (see `craft.storage.eventlog`).

These threads' transactions lock sessions' lease rows (a claim, a renewal, the event log's
fence). On PostgreSQL their connections end any transaction left idle for longer than a lease
(`idle_in_transaction_session_timeout`): a worker paused between a statement and its commit
(stopped, swapped out, partitioned) would otherwise hold its lease row until its connection
died, hours later, and every other worker's claim of that session would wait for it. The
server ends the transaction and the connection; the thread's next call fails, closes it and
opens another (`close_broken_connections`), and the writer of a worker that lost its lease
then finds itself fenced.
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

import psycopg
from django.conf import settings
from django.db import connections
from django.db.backends.signals import connection_created

logger = logging.getLogger(__name__)

T = TypeVar("T")
_STOP = object()


def close_broken_connections() -> None:
    """Close this thread's connections that an error left unusable (the next call reopens)."""
    for connection in connections.all(initialized_only=True):
        if connection.connection is not None and not connection.is_usable():
            connection.close()


# Set on the threads whose transactions lock lease rows (`DatabaseThreads`, the event writer).
_lease_threads = threading.local()


def limit_idle_transactions() -> None:
    """Make the PostgreSQL connections this thread opens end a transaction that idles for
    longer than a lease (the module's docstring says why); call it before the thread's first
    query. `close_thread_connections` gives the connections back without it."""
    _lease_threads.limited = True  # before the thread's first connection (`_on_connect`)


def _limit(connection: Any) -> None:
    if connection.vendor != "postgresql":
        return
    milliseconds = str(round(float(settings.CRAFT_SESSION_LEASE_SECONDS) * 1000))
    # On the driver's connection, as Django sets a new connection's time zone: part of
    # connecting, not a query of whatever the thread runs.
    with connection.connection.cursor() as cursor:
        cursor.execute(
            "SELECT set_config('idle_in_transaction_session_timeout', %s, false)", [milliseconds]
        )


def _on_connect(sender: Any, connection: Any, **kwargs: Any) -> None:
    if getattr(_lease_threads, "limited", False):
        _limit(connection)


connection_created.connect(_on_connect, dispatch_uid="craft.storage.db.limit_idle_transactions")


def close_thread_connections() -> None:
    """Close this thread's connections, first taking back `limit_idle_transactions` (a pooled
    connection goes on to other threads, whose transactions may idle for long)."""
    if getattr(_lease_threads, "limited", False):
        _lease_threads.limited = False
        for connection in connections.all(initialized_only=True):
            if connection.vendor == "postgresql" and connection.connection is not None:
                try:
                    with connection.connection.cursor() as cursor:
                        cursor.execute("RESET idle_in_transaction_session_timeout")
                except psycopg.Error:
                    pass  # a broken connection: closing it drops it from the pool
    connections.close_all()


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
        limit_idle_transactions()
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
            close_thread_connections()


# ORM calls of event-loop code, reads and small writes (leases, a session's title): not the
# event log's appends, which go through its writer.
db_calls = DatabaseThreads("craft-db-call", 4)


def db_sync_to_async(func: Callable[..., T]) -> Callable[..., Any]:
    """Wrap a blocking ORM function so that event-loop code can await it (on `db_calls`)."""

    @functools.wraps(func)
    async def call(*args: Any, **kwargs: Any) -> T:
        return await db_calls.run(functools.partial(func, *args, **kwargs))

    return call
