"""Live delivery: after events commit, every socket that follows their session hears of them.

Inside a process, delivery is direct and from memory: the event log hands each committed
batch (seq range plus the encoded frames) to the `LiveHub` of every event loop, which passes it
to the sockets that follow that session. Nothing is dropped and nothing is read back, and a
socket that finds a gap (it missed a notice, or the notice came without frames) reads the
database from its last seq: the log stays the record.

Other processes hear a doorbell on the channel layer (Redis): `events.available` with the last
seq and this process's id, and read the events from the database themselves. With the
in-memory channel layer there are no other processes, so no doorbell is rung.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import Callable
from typing import Any, Protocol
from uuid import UUID

from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer

from craft.live.channel_layer import group_send_elsewhere_many
from craft.live.loops import Background, Listeners, PerLoop
from craft.storage.eventlog import Notice

logger = logging.getLogger(__name__)

# Who rang a doorbell: a process ignores its own, which it has already delivered from memory.
PROCESS_ID = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"

# Doorbells to other processes carry the frames of batches up to this size.
DOORBELL_FRAMES_BYTES = 64 * 1024


def carried(frames: list[str] | None) -> bool:
    """Whether a notice to another process carries the batch's frames (small batches do:
    the sockets there send them without reading the log)."""
    return frames is not None and sum(len(frame) for frame in frames) <= DOORBELL_FRAMES_BYTES


def session_group(session_id: UUID) -> str:
    return f"session.{UUID(str(session_id)).hex}"


class Follower(Protocol):
    """A socket that follows a session (see craft.live.consumer.SessionConsumer)."""

    def deliver(self, first_seq: int, last_seq: int, frames: list[str] | None) -> None: ...


class LiveHub:
    """The followers of each session on one event loop; used on that loop only."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.followers: Listeners[Follower] = Listeners()
        self._rings = Background()

    def deliver(self, notices: list[Notice]) -> None:
        for session_id, first, last, frames in notices:
            for follower in self.followers.of(session_id):
                try:
                    follower.deliver(first, last, frames)
                except Exception:
                    logger.exception("delivering events of session %s failed", session_id)

    def ring(self, notices: list[Notice]) -> None:
        """Ring the doorbell of other processes (on this loop): one commit's sessions
        together."""
        layer = get_channel_layer()
        if layer is None or isinstance(layer, InMemoryChannelLayer) or not notices:
            return
        self._rings.start(self.loop, _ring(layer, notices))


async def _ring(layer: Any, notices: list[Notice]) -> None:
    sends = []
    for session_id, first_seq, last_seq, frames in notices:
        message: dict[str, Any] = {
            "type": "events.available", "first_seq": first_seq, "last_seq": last_seq,
            "origin": PROCESS_ID,
        }  # fmt: skip
        if carried(frames):
            message["frames"] = frames
        sends.append((session_group(session_id), message))
    try:  # this process's own sockets were told from memory (`LiveHub.deliver`)
        await group_send_elsewhere_many(layer, sends)
    except Exception:
        # The log is committed; other processes catch up on their next doorbell or resume.
        logger.exception("doorbells for sessions %s failed", ", ".join(str(n[0]) for n in notices))


_hubs: PerLoop[LiveHub] = PerLoop(LiveHub)


def hub() -> LiveHub:
    """Return the hub of the running event loop (created on first use)."""
    return _hubs.here()


def follow(session_id: UUID, follower: Follower) -> None:
    hub().followers.add(session_id, follower)


def unfollow(session_id: UUID, follower: Follower) -> None:
    hub().followers.discard(session_id, follower)


def publish(
    notices: list[Notice], settle: dict[asyncio.AbstractEventLoop, Callable[[], None]] | None = None
) -> None:
    """Tell every follower of these sessions that events were committed (from any thread).

    `settle` maps event loops to a callback to run there right after delivery (the event
    writer resolves its callers' futures this way): one cross-thread wake-up per loop and
    commit, not one per future and one per delivery.
    """
    settle = dict(settle or {})
    try:
        current = asyncio.get_running_loop()
    except RuntimeError:
        current = None
    rung = not notices
    for loop, each in _hubs.items():
        after = settle.pop(loop, None)
        if loop is current:
            _on_loop(each, notices, not rung, after)
        else:
            loop.call_soon_threadsafe(_on_loop, each, notices, not rung, after)
        rung = True
    for loop, after in settle.items():
        if not loop.is_closed():
            loop.call_soon_threadsafe(after)
    if rung:
        return
    if current is not None:
        hub().ring(notices)
    else:
        _ring_from_thread(notices)


def _on_loop(
    each: LiveHub, notices: list[Notice], ring: bool, after: Callable[[], None] | None
) -> None:
    each.deliver(notices)
    if ring:
        each.ring(notices)
    if after is not None:
        after()


def _ring_from_thread(notices: list[Notice]) -> None:
    """Ring other processes from a thread without an event loop (commands, sync callers)."""
    layer = get_channel_layer()
    if layer is None or isinstance(layer, InMemoryChannelLayer):
        return
    for session_id, _, last_seq, _ in notices:
        try:
            async_to_sync(layer.group_send)(
                session_group(session_id),
                {"type": "events.available", "last_seq": last_seq, "origin": PROCESS_ID},
            )
        except Exception:
            logger.exception("doorbell for session %s failed", session_id)


def tell_session(session_id: UUID, message: dict[str, Any]) -> None:
    """Send a message to every socket of a session, in every process (from a sync thread)."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(session_group(session_id), message)
    except Exception:
        logger.exception("telling the sockets of session %s failed", session_id)
