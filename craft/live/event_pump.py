"""A session socket's events: each stored event sent once, in seq order, after `resume`.

After `resume` the pump reads every stored event after the client's seq from the database,
then follows the session live: the live layer hands it each committed batch with its frames
already encoded (`deliver`); it sends whatever continues from the last seq it sent, and reads
the database again whenever it finds a gap. One task does all the sending, so frames never
interleave; a client that stops reading is closed (4408) rather than held in memory.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

from django.conf import settings

from craft.live.outbuffer import client_keeps_up
from craft.storage.db import db_sync_to_async
from craft.storage.eventlog import frames_after

logger = logging.getLogger(__name__)

CLOSE_TOO_SLOW = 4408
REPLAY_PAGE = 2000
# While sending a long run of frames, let the event loop (and other sockets) in this often.
YIELD_EVERY = 256
# Live batches held for a socket that is busy sending; past this it reads the log instead.
BACKLOG_BATCHES = 1_000


class TooSlow(Exception):
    """The client did not read what it was sent for too long."""


@db_sync_to_async
def _frames_after(session_id: UUID, seq: int) -> list[tuple[int, str]]:
    return frames_after(session_id, seq, limit=REPLAY_PAGE)


class EventPump:
    """The events of one session on one socket (which hands it what the live layer delivers).

    `send` is the socket's ASGI send (its frames are written as they are, the workspace path
    replaced by `scrub` unless None); `close` closes the socket with a code.
    """

    sent_seq: int | None = None  # None until the client resumes: no events before that
    _known_seq = 0  # the highest seq known to be stored
    _backlog: deque[tuple[int, list[str]]] | None = None  # (first seq, frames) not sent yet
    _catch_up = False  # read the database after sent_seq before using the backlog
    _task: asyncio.Task[None] | None = None

    def __init__(
        self,
        session_id: UUID,
        send: Callable[[dict[str, Any]], Awaitable[None]],
        scrub: Callable[[str], str] | None,
        close: Callable[[int], Awaitable[None]],
    ) -> None:
        self.session_id = session_id
        self._send = send
        self._scrub = scrub
        self._close = close

    async def resume(self, after: int) -> None:
        """Send the stored events after `after`, then the live ones (a resume starts over)."""
        await self.stop()
        self.sent_seq = after
        self._backlog = None
        self._catch_up = True
        self._start()

    async def stop(self) -> None:
        """Stop sending (and wait until the task has stopped)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def cancel(self) -> None:
        """Stop sending, without waiting (the socket is gone)."""
        if self._task is not None:
            self._task.cancel()

    def deliver(self, first_seq: int, last_seq: int, frames: list[str] | None) -> None:
        """Take a committed batch (from the live layer, on the event loop) and send it."""
        if self.sent_seq is None or last_seq <= self.sent_seq:
            return
        self._known_seq = max(self._known_seq, last_seq)
        if frames is None:
            self._catch_up = True
        else:
            if self._backlog is None:
                self._backlog = deque()
            self._backlog.append((first_seq, frames))
            if len(self._backlog) > BACKLOG_BATCHES:
                # Far behind (a slow client): drop what is held here; the log has it.
                self._backlog = None
                self._catch_up = True
        self._start()

    def _start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._pump_events())

    async def _pump_events(self) -> None:
        try:
            await self._send_pending()
        except TooSlow:
            self._backlog = None
            await self._close(CLOSE_TOO_SLOW)

    async def _send_pending(self) -> None:
        """Send every event after `sent_seq` that is known to be stored, in order."""
        assert self.sent_seq is not None
        while True:
            if self._catch_up:
                self._catch_up = False
                rows = await _frames_after(self.session_id, self.sent_seq)
                await self._send_frames(rows)
                if len(rows) == REPLAY_PAGE:
                    self._catch_up = True
                elif not rows and not self._backlog:
                    self._known_seq = self.sent_seq  # nothing more is stored (session gone)
                continue
            backlog = self._backlog
            while backlog and backlog[0][0] + len(backlog[0][1]) - 1 <= self.sent_seq:
                backlog.popleft()
            if not backlog:
                if self.sent_seq < self._known_seq:
                    self._catch_up = True
                    continue
                return
            first, frames = backlog[0]
            if first > self.sent_seq + 1:
                self._catch_up = True  # a gap: the database has what is missing
                continue
            backlog.popleft()
            skip = self.sent_seq + 1 - first
            await self._send_frames([(first + i, frames[i]) for i in range(skip, len(frames))])

    async def _send_frames(self, rows: list[tuple[int, str]]) -> None:
        send = self._send
        scrub = self._scrub
        for count, (seq, frame) in enumerate(rows, 1):
            # Frames are shared by every socket of the session: the path is replaced here.
            text = frame if scrub is None else scrub(frame)
            await send({"type": "websocket.send", "text": text})
            self.sent_seq = seq
            if count % YIELD_EVERY == 0 or count == len(rows):
                await self._wait_for_reader()

    async def _wait_for_reader(self) -> None:
        """Let other sockets in; hold on while this client has not read what it was sent,
        and close it (4408, resume later) if it does not read for CRAFT_SOCKET_STALL_SECONDS.
        What a socket holds in memory is so bounded by CRAFT_SOCKET_BUFFER_BYTES."""
        await asyncio.sleep(0)
        limit, stall = settings.CRAFT_SOCKET_BUFFER_BYTES, settings.CRAFT_SOCKET_STALL_SECONDS
        if not await client_keeps_up(self._send, limit, stall):
            logger.info("session %s: a client stopped reading; closing", self.session_id)
            raise TooSlow
