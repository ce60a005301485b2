"""A session's commands reach the worker that owns it, wherever the client is connected.

`route` carries a command out here if this worker owns the session (or can take it over:
`craft.cluster.leases`), else sends it to the owner: over a direct link to the owner's
address (`craft.cluster.peers`), or, when there is none or it cannot be opened, to the
owner's channel on the channel layer. The owner carries it out as its own and replies the
same way, its refusal included. A forward that gets no reply (the owner died) is tried
again, and once the lease has expired this worker takes the session over.

This module moves commands without knowing what they mean: what carries them out here is
wired in at start (`serve`, from `CraftConfig.ready`), so that a command passes each layer
once: socket, services, forwarding, runner. Each worker listens on its own channel
(`Listener`) and its own port; the in-memory channel layer has one worker only, so nothing is
forwarded there.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

from channels.layers import get_channel_layer

from craft.cluster.leases import Claim, lease_seconds, ownership
from craft.cluster.peers import links
from craft.commands import SessionCommand, from_wire, to_wire
from craft.errors import Refused
from craft.models import Worker
from craft.storage import workers
from craft.storage.db import db_calls

logger = logging.getLogger(__name__)

# How long a forwarded command may wait for the owner's reply before the owner is asked again.
FORWARD_TIMEOUT = 2.0

# Carries a command out in this worker, under the session's lease token.
Handler = Callable[[UUID, SessionCommand, int], Awaitable[None]]


class Unavailable(Exception):
    """No worker could take the session's command (its owner is silent and still holds it)."""


class Listener:
    """This worker's channel: commands forwarded to it, and replies to those it forwarded."""

    def __init__(self) -> None:
        self.channel: str = ""
        self.handler: Handler | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._replies: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._handling: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        """Listen on a new channel on this loop (once); return its name."""
        loop = asyncio.get_running_loop()
        if self._task is not None and self._loop is loop and not self._task.done():
            return self.channel
        layer = get_channel_layer()
        # The default prefix: channels_redis reads one process's channels through a single
        # Redis key only if they all share it (a second prefix starves the sockets' channels).
        self.channel = await layer.new_channel()
        self._loop = loop
        self._task = loop.create_task(self._listen(layer))
        links.on_command = carry_out
        peer = await links.start()
        await db_calls.run(_publish_address, self.channel, peer)
        return self.channel

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        links.stop()

    async def _listen(self, layer: Any) -> None:
        while True:
            message = await layer.receive(self.channel)
            if message.get("type") == "command.reply":
                future = self._replies.pop(message.get("request", ""), None)
                if future is not None and not future.done():
                    future.set_result(message)
            elif message.get("type") == "session.command":
                task = asyncio.get_running_loop().create_task(self._handle(layer, message))
                self._handling.add(task)
                task.add_done_callback(self._handling.discard)

    async def _handle(self, layer: Any, message: dict[str, Any]) -> None:
        reply = await carry_out(message["session"], message["command"])
        await layer.send(
            message["reply_to"], {"type": "command.reply", "request": message["request"], **reply}
        )

    async def forward(
        self, channel: str, session_id: UUID, command: SessionCommand
    ) -> dict[str, Any] | None:
        """Send a command to its session's owner; return its reply, None without one in time."""
        layer = get_channel_layer()
        request = uuid.uuid4().hex
        future = asyncio.get_running_loop().create_future()
        self._replies[request] = future
        try:
            await layer.send(
                channel,
                {"type": "session.command", "request": request, "session": str(session_id),
                 "command": to_wire(command), "reply_to": self.channel},
            )  # fmt: skip
            return await asyncio.wait_for(future, FORWARD_TIMEOUT)
        except (TimeoutError, Exception) as exc:
            if not isinstance(exc, TimeoutError):
                logger.warning("forwarding to %s failed: %s", channel, exc)
            return None
        finally:
            self._replies.pop(request, None)


async def carry_out(session: str, wire: dict[str, Any]) -> dict[str, Any]:
    """Carry out a command another worker forwarded here; return the reply's fields."""
    try:
        await route(UUID(session), from_wire(wire), forwarded=True)
    except Refused as refused:
        return {"code": refused.code, "message": refused.message}
    except Unavailable:
        return {"unavailable": True}
    except Exception as exc:
        logger.exception("forwarded command for session %s failed", session)
        return {"code": "internal_error", "message": f"internal error: {exc}"}
    return {}


def _publish_address(channel: str, peer: str) -> None:
    workers.ensure_registered()
    Worker.objects.filter(pk=workers.me().key).update(channel=channel, peer=peer)


listener = Listener()


def serve(
    handle: Handler,
    lose: Callable[[UUID], Awaitable[None]],
    take_over: Callable[[UUID, str], None],
) -> None:
    """Carry out this worker's commands with `handle`; tell `lose` of a lease it lost, and
    `take_over` (session, previous owner) of one it took over from a worker gone or late."""
    listener.handler = handle
    ownership.on_lost = lose
    ownership.on_taken_over = take_over


async def route(session_id: UUID, command: SessionCommand, *, forwarded: bool = False) -> None:
    """Carry out a session's command here if this worker owns the session (or can take it
    over), else forward it to the owner; raise the owner's `Refused` here."""
    assert listener.handler is not None, "craft.cluster.forwarding.serve() was not called"
    deadline = time.monotonic() + lease_seconds() + FORWARD_TIMEOUT
    while True:
        claim = await ownership.claim(session_id)
        if claim.mine:
            await listener.handler(session_id, command, claim.token)
            return
        if forwarded:
            # The owner changed while the command was on its way: the sender asks again.
            raise Unavailable
        if claim.channel or claim.peer:
            await listener.start()
            reply = await _forward(claim, session_id, command)
            if reply is not None and not reply.get("unavailable"):
                if reply.get("code"):
                    raise Refused(reply["code"], reply["message"])
                return
            ownership.forget_owner(session_id)
        if time.monotonic() > deadline:
            raise Refused(
                "unavailable", "the server running this session does not answer; try again"
            )
        await asyncio.sleep(0.2)


async def _forward(
    claim: Claim, session_id: UUID, command: SessionCommand
) -> dict[str, Any] | None:
    """Send a command to the session's owner; return its reply, None without one in time."""
    link = await links.link_to(claim.peer) if claim.peer else None
    if link is not None:
        return await link.request(session_id, to_wire(command), FORWARD_TIMEOUT)
    if not claim.channel:
        return None
    return await listener.forward(claim.channel, session_id, command)
