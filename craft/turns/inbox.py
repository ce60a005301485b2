"""The inbox between an agent's reader thread and its session's runner on the event loop.

The reader thread parses the agent's output and `put`s items; the runner `take`s them in
batches. A fast stream costs one cross-thread wake-up per pause of the runner, not one per
item, and an agent that outruns storage is held back (its reader waits, and the pipe holds
the agent) instead of piling up in memory.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from sandboxes.agent.protocol import TurnEnd, TurnFailed, TurnItem

# An agent's reader waits when this many items wait to be stored (at most INBOX_WAIT s a time).
INBOX_HIGH = 10_000
INBOX_WAIT = 5.0


def _ends(item: Any) -> bool:
    return isinstance(item, TurnEnd | TurnFailed)


class Inbox:
    """Items from an agent's reader thread, taken on the event loop in batches.

    `put` may be called from any thread. It wakes the event loop only when the taker is
    asleep, waiting for items: while the taker is busy storing a batch, the next one simply
    piles up, so a fast stream costs a cross-thread wake-up per pause, not per item. Items
    that arrive while nobody takes (updates after the prompt response) go to `on_idle`.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, on_idle: Callable[[], None]) -> None:
        self._loop = loop
        self._items: deque[TurnItem] = deque()
        self._asleep = True  # nobody is taking: put() must wake the loop
        self._woken = False  # a wake-up is on its way
        self._waiter: asyncio.Future[None] | None = None
        self._timed_out = False  # take()'s timeout passed
        self._taking = 0
        self._on_idle = on_idle
        self._room = threading.Event()
        self._room.set()
        self._loop_thread = threading.get_ident()  # made on the loop; never block it

    def put(self, item: TurnItem) -> None:
        self._items.append(item)
        if self._asleep and not self._woken:
            self._woken = True
            self._loop.call_soon_threadsafe(self._wake)
        if len(self._items) > INBOX_HIGH and threading.get_ident() != self._loop_thread:
            # Storage is behind: hold the agent's reader (and so, through the pipe, the
            # agent) until the taker has caught up, instead of piling its output up here.
            self._room.clear()
            if len(self._items) > INBOX_HIGH:
                self._room.wait(INBOX_WAIT)

    def _wake(self) -> None:
        self._woken = False
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        elif not self._taking and self._items:
            self._on_idle()

    def __enter__(self) -> Inbox:
        self._taking += 1
        self._asleep = False
        return self

    def __exit__(self, *exc: object) -> None:
        self._taking -= 1
        if not self._taking:
            self._asleep = True
            if self._items:
                self._on_idle()  # items that came after the taker's last look

    # asyncio.timeout() would cost a timer per batch, even for items already there.
    async def take(self, limit: int, timeout: float | None = None) -> list[TurnItem]:  # noqa: ASYNC109
        """Wait for items, at most `timeout` s (then TimeoutError); return up to `limit` of
        them, never past the end of a turn.

        The timeout is a timer of its own, armed only when there is nothing to take: unlike
        `asyncio.wait_for` (a task, a timer and a future per call), a stream's batches that
        are already there cost nothing but the batch."""
        if not self._items:
            self._timed_out = False
            timer = None if timeout is None else self._loop.call_later(timeout, self._time_out)
            try:
                while not self._items:
                    if self._timed_out:
                        raise TimeoutError
                    self._waiter = self._loop.create_future()
                    self._asleep = True
                    try:
                        if not self._items:  # put() may have missed that we were about to sleep
                            await self._waiter
                    finally:
                        self._asleep = not self._taking
                        self._waiter = None
            finally:
                if timer is not None:
                    timer.cancel()
        return self.take_nowait(limit)

    def _time_out(self) -> None:
        self._timed_out = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def take_nowait(self, limit: int) -> list[TurnItem]:
        batch: list[TurnItem] = []
        while self._items and len(batch) < limit:
            batch.append(self._items.popleft())
            if _ends(batch[-1]):
                break
        if len(self._items) <= INBOX_HIGH // 2:
            self._room.set()
        return batch
