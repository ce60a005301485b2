"""What live delivery and live status share: one hub per event loop, and who listens to what.

A server process may run several event loops (daphne's, and tests' own); what a socket
listens to is used on its loop only, so each loop has its hub, and a sender from any thread
hands its news to every loop's hub (`PerLoop.items`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

Hub = TypeVar("Hub")
Member = TypeVar("Member")


class PerLoop(Generic[Hub]):
    """One hub per event loop of this process, made on first use on that loop."""

    def __init__(self, make: Callable[[asyncio.AbstractEventLoop], Hub]) -> None:
        self._make = make
        self._hubs: dict[asyncio.AbstractEventLoop, Hub] = {}
        self._lock = threading.Lock()

    def here(self) -> Hub:
        """Return the running loop's hub."""
        loop = asyncio.get_running_loop()
        found = self._hubs.get(loop)
        if found is None:
            with self._lock:
                for closed in [other for other in self._hubs if other.is_closed()]:
                    del self._hubs[closed]
                found = self._hubs.setdefault(loop, self._make(loop))
        return found

    def items(self) -> list[tuple[asyncio.AbstractEventLoop, Hub]]:
        """Every open loop's hub (from any thread)."""
        return [(loop, hub) for loop, hub in list(self._hubs.items()) if not loop.is_closed()]


class Listeners(Generic[Member]):
    """Who listens to each key (a session, a user) on one loop."""

    def __init__(self) -> None:
        self._by_key: dict[Any, set[Member]] = {}

    def add(self, key: Any, member: Member) -> None:
        self._by_key.setdefault(key, set()).add(member)

    def discard(self, key: Any, member: Member) -> None:
        members = self._by_key.get(key)
        if members is not None:
            members.discard(member)
            if not members:
                del self._by_key[key]

    def of(self, key: Any) -> tuple[Member, ...]:
        """The listeners of `key` now (a copy: a listener may stop listening meanwhile)."""
        return tuple(self._by_key.get(key, ()))


class Background:
    """Tasks started and not awaited, held until they end (the loop keeps only weak refs)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self, loop: asyncio.AbstractEventLoop, work: Any) -> None:
        task = loop.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
