"""The session websocket (API v1, see docs/websocket-api.md).

The consumer signs the socket in (`craft.live.sign_in`), authorises, turns each client frame
into a checked command (`craft.commands`) and hands it to the session
(`services.run_command`), or, for the socket's own commands, to its handler named after the
frame type; it never runs a turn itself. Its session's events are sent by its
`craft.live.event_pump.EventPump` (after `resume`, each once, in seq order), the person's
status by `craft.live.session_status.FollowsStatus`, and the account it was opened with is
followed by `craft.live.accounts.FollowsAccount` (closed with 4401 when the right to it ends).
"""

from __future__ import annotations

import json
import logging
from typing import Any, NamedTuple
from uuid import UUID

from channels.consumer import get_handler_name
from channels.generic.websocket import AsyncWebsocketConsumer

from craft import commands, services, workspace_paths
from craft.errors import Refused
from craft.live import delivery, status
from craft.live.accounts import signed_in_as
from craft.live.event_pump import EventPump
from craft.live.session_status import FollowsStatus
from craft.live.sign_in import SignsIn
from craft.models import Session
from craft.storage.db import db_sync_to_async
from craft.workspace_paths import Scrub

logger = logging.getLogger(__name__)

CLOSE_DELETED = 4404


# What the channel layer may bring a session socket: the doorbell, the two closings and the
# person's status notices (craft.live.status). Anything else from the layer (a forged
# `websocket.receive` above all) is dropped.
LAYER_MESSAGES = {
    "events.available", "session.deleted", "account.closed",
    status.SANDBOX_CHANGED, status.SESSIONS_CHANGED, status.AGENT_STDERR,
}  # fmt: skip


class FromSocket(dict[str, Any]):
    """A message from the client's own websocket (the ASGI server's `receive`).

    The channel layer yields plain dicts, so nothing sent through it can pass for one: the
    type is the proof of where a `websocket.*` message came from.
    """


class Opening(NamedTuple):
    """What a socket reads once it listens (`_opening`)."""

    auth_hash: str | None  # None: its browser session no longer signs its user in
    session: Session | None  # None: not the user's session (or none at all)
    scrub: Scrub | None  # what hides the workspace path from the user (None: staff)


@db_sync_to_async
def _opening(user: Any, session_key: str | None, session_id: UUID) -> Opening:
    """Whether the socket's browser session still signs `user` in, and their session with its
    sandbox: one trip to the database threads."""
    auth_hash = signed_in_as(session_key, user.pk)
    if auth_hash is None:
        return Opening(None, None, None)
    session = Session.objects.one_of(user, session_id)
    if session is None:
        return Opening(auth_hash, None, None)
    return Opening(
        auth_hash, session, workspace_paths.scrubber_for(user, session.sandbox, session.pk)
    )


@db_sync_to_async
def _mark_seen(user: Any, session_id: UUID) -> None:
    services.mark_seen(user, session_id)


class SessionConsumer(SignsIn, FollowsStatus, AsyncWebsocketConsumer):
    session_id: UUID
    events: EventPump | None = None  # once the socket follows its session
    # Replaces the workspace's host path in what this socket sends (None: staff see it).
    _scrub: Scrub | None = None
    _listening = False

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        async def from_socket() -> FromSocket:
            return FromSocket(await receive())

        await super().__call__(scope, from_socket, send)

    async def dispatch(self, message: dict[str, Any]) -> None:
        """Handle one message, if it came from where such messages may come from.

        `websocket.*` only from the client's socket, and only `LAYER_MESSAGES` from the
        channel layer: whoever else can write to the layer cannot type for this user.

        Channels' own dispatch hops to asgiref's sync thread before every message (each
        doorbell from another worker, each client frame) to close that thread's stale
        database connections; this consumer never uses that thread's connection (its database
        work runs on `craft.storage.db.db_calls`), and the hop is on the path of every forwarded
        event.
        """
        kind = message.get("type")
        if isinstance(message, FromSocket) != str(kind).startswith("websocket.") or (
            not isinstance(message, FromSocket) and kind not in LAYER_MESSAGES
        ):
            logger.warning(
                "session %s: dropped a %r message from the channel layer", self.session_id, kind
            )
            return
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"no handler for message type {message['type']}")
        await handler(message)

    async def connect(self) -> None:
        self.session_id = self.scope["url_route"]["kwargs"]["session_id"]
        if not await self.sign_in():
            return
        # Listen before reading: a sign-out (closes the socket, 4401) or a status change
        # (marks it stale until the hello) committed after the read below reaches this
        # socket, and the read sees whatever was committed before.
        status.listen(self.user.pk, self)
        self._listening = True
        opening = await _opening(self.user, self.session_key, self.session_id)
        self._scrub = opening.scrub
        if not await self.admit(opening.auth_hash, opening.session is not None):
            return
        session = opening.session
        assert session is not None
        self.group = delivery.session_group(self.session_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        self.events = EventPump(self.session_id, self.base_send, self._scrub, self._close_with)
        delivery.follow(self.session_id, self)
        self.sandbox_id = session.sandbox_id
        self._sandbox_sent = status.sandbox_state(session.sandbox)
        self._sandbox_sent["error"] = self.scrubbed(self._sandbox_sent["error"])
        await self.send_json(
            {
                "type": "hello",
                "session": str(self.session_id),
                "last_seq": session.last_seq,
                "running": session.running,
                "sandbox": self._sandbox_sent,
            }
        )
        self._hello_sent = True
        if self._sandbox_stale or self._sessions_stale:
            self._start_status()  # a change noticed while opening: sent after the hello

    async def _refuse(self, code: int) -> None:
        await self.unfollow_account()
        # Accept first: a close code only reaches the client on an accepted websocket.
        if not self._accepted:
            await self.accept()
        await self.close(code=code)

    async def _close_with(self, code: int) -> None:
        await self.close(code=code)

    async def disconnect(self, code: int) -> None:
        # The turn goes on: only `cancel` stops it.
        await self.unfollow_account()
        if self.events is not None:
            delivery.unfollow(self.session_id, self)
            self.events.cancel()
        if self._listening:
            status.stop_listening(self.user.pk, self)
            self._listening = False
        self.stop_status()
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if text_data is None:
            await self.send_error("bad_frame", "frames must be JSON text")
            return
        try:
            frame = json.loads(text_data)
        except ValueError:
            await self.send_error("bad_json", "the frame is not valid JSON")
            return
        except RecursionError:
            await self.send_error("bad_json", "the frame is nested too deeply")
            return
        if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
            await self.send_error("bad_frame", "a frame is a JSON object with a string 'type'")
            return
        try:
            command = commands.parse(frame)
            if isinstance(command, commands.SocketCommand):
                await getattr(self, f"handle_{command.frame_type}")(command)
            else:
                await services.run_command(self.session_id, command)
        except Refused as refused:
            await self.send_error(refused.code, refused.message)
        except Session.DoesNotExist:
            await self.session_deleted({})

    # --- the socket's own commands (checked by craft.commands; the rest go to the session) ---

    async def handle_resume(self, resume: commands.Resume) -> None:
        if self.events is not None:  # None: the socket was refused at its connect
            await self.events.resume(resume.after)

    async def handle_seen(self, seen: commands.Seen) -> None:
        await _mark_seen(self.user, self.session_id)

    async def handle_follow_sessions(self, follow: commands.FollowSessions) -> None:
        self.follow_sessions()

    # --- the session's events (sent by its EventPump) and the channel layer -------------------

    def deliver(self, first_seq: int, last_seq: int, frames: list[str] | None) -> None:
        """Take a committed batch (from the live layer, on the event loop) and send it."""
        if self.events is not None:
            self.events.deliver(first_seq, last_seq, frames)

    async def session_deleted(self, message: dict[str, Any]) -> None:
        """The session was deleted (here or in another process): say so and close."""
        await self.send_error("session_deleted", "this session was deleted")
        await self.close(code=CLOSE_DELETED)

    async def events_available(self, message: dict[str, Any]) -> None:
        """Another process stored events (the channel-layer doorbell): read them."""
        if message.get("origin") != delivery.PROCESS_ID:
            last = message["last_seq"]
            self.deliver(message.get("first_seq", last), last, message.get("frames"))

    # --- helpers ----------------------------------------------------------------------------

    async def send_json(self, content: dict[str, Any]) -> None:
        await self.send(text_data=json.dumps(content, ensure_ascii=False))

    async def send_error(self, code: str, message: str) -> None:
        await self.send_json({"type": "error", "code": code, "message": self.scrubbed(message)})

    def scrubbed(self, text: str) -> str:
        return text if self._scrub is None else self._scrub(text)
