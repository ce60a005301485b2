"""The writer: group commits for event-loop code. One thread per process commits whatever
every session has queued, in one transaction per batch; a session's events are queued in the
order they happened, so seqs follow that order. After commit the writer hands each batch's
frames, already encoded, to the `Listener` (the live layer, wired at start), which sends them
to this process's sockets without reading them back."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Sequence
from functools import partial
from typing import Any
from uuid import UUID

from django.db import transaction
from django.utils import timezone

from craft.storage.db import (
    close_broken_connections,
    close_thread_connections,
    limit_idle_transactions,
)
from craft.storage.eventlog.batches import _Job, _store_batch
from craft.storage.eventlog.records import Fence, Notice, Stored, _encode, _heard

logger = logging.getLogger(__name__)

# A batch stops growing at this many events, so one commit never holds everyone for long.
BATCH_EVENTS = 2_000
_STOP = object()


class EventWriter:
    """The process's event writer: one thread, one transaction per batch of queued appends."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    async def append(
        self,
        session_id: UUID,
        events: Sequence[tuple[str, dict[str, Any]]],
        *,
        client_id: str | None = None,
        fence: Fence | None = None,
    ) -> Stored | None:
        """Store events for a session and wait until they are committed; see append_events.

        With `fence`, raise `Fenced` (and store nothing) if that lease was taken over.
        """
        return await self.submit(session_id, events, client_id=client_id, fence=fence)

    def submit(
        self,
        session_id: UUID,
        events: Sequence[tuple[str, dict[str, Any]]],
        *,
        client_id: str | None = None,
        fence: Fence | None = None,
    ) -> asyncio.Future[Stored | None]:
        """Queue events for a session; the future resolves on this loop after commit.

        Appends of one session are committed in the order they were submitted, so a caller
        may submit the next batch before the previous one is committed.
        """
        loop = asyncio.get_running_loop()
        _heard().on_loop()  # this loop hears of the commit (and rings other processes) first-hand
        future: asyncio.Future[Stored | None] = loop.create_future()
        if self._thread is None:
            self._start()
        self._queue.put(_Job(session_id, events, client_id, fence, loop, future))
        return future

    def stop(self) -> None:
        """Commit what is queued, close the connection, end the thread."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(_STOP)
            thread.join(30)

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="craft-event-writer", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        limit_idle_transactions()
        try:
            while True:
                job = self._queue.get()
                if job is _STOP:
                    return
                jobs, stop = [job], False
                size = len(job.events)
                while size < BATCH_EVENTS:
                    try:
                        job = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if job is _STOP:
                        stop = True
                        break
                    jobs.append(job)
                    size += len(job.events)
                self._commit(jobs)
                if stop:
                    return
        finally:
            close_thread_connections()

    def _commit(self, jobs: list[_Job]) -> None:
        """Store a batch in one transaction; if it fails, store each job on its own."""
        outcomes: list[tuple[_Job, Stored | None, BaseException | None]]
        try:
            outcomes = [(job, stored, None) for job, stored in self._store(jobs)]
        except Exception:
            close_broken_connections()
            outcomes = []
            for job in jobs:
                try:
                    ((_, stored),) = self._store([job])
                except Exception as exc:
                    logger.warning("storing events of session %s failed: %s", job.session_id, exc)
                    close_broken_connections()
                    outcomes.append((job, None, exc))
                else:
                    outcomes.append((job, stored, None))
        self._finish(outcomes)

    def _store(self, jobs: list[_Job]) -> list[tuple[_Job, Stored | None]]:
        now = timezone.now()
        # Sessions in a fixed order (a stable sort keeps each session's own order), so that
        # two processes' writers always lock session rows in the same order.
        encoded = sorted(((job, _encode(job.events)) for job in jobs), key=_session_key)
        with transaction.atomic():
            return _store_batch(encoded, now)

    def _finish(self, outcomes: list[tuple[_Job, Stored | None, BaseException | None]]) -> None:
        """Deliver what was stored and resolve the callers' futures, one wake-up per loop."""
        notices: list[Notice] = [
            (job.session_id, stored.first_seq, stored.last_seq, stored.frames)
            for job, stored, _ in outcomes
            if stored is not None
        ]
        by_loop: dict[asyncio.AbstractEventLoop, list[Any]] = {}
        for outcome in outcomes:
            by_loop.setdefault(outcome[0].loop, []).append(outcome)
        _heard().publish(
            notices, {loop: partial(_settle, items) for loop, items in by_loop.items()}
        )


def _settle(outcomes: list[tuple[_Job, Stored | None, BaseException | None]]) -> None:
    for job, stored, exc in outcomes:
        if job.future.done():
            continue  # its caller gave up waiting (cancelled)
        if exc is not None:
            job.future.set_exception(exc)
        else:
            job.future.set_result(stored)


def _session_key(pair: tuple[_Job, Any]) -> str:
    return str(pair[0].session_id)


writer = EventWriter()
