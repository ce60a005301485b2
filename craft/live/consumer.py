"""The session websocket (API v1, see docs/websocket-api.md).

The consumer authenticates, authorises, turns each client frame into a checked command
(`craft.commands`) and hands it to the session (`services.run_command`), or, for the socket's
own commands, to its handler named after the frame type; it never runs a turn itself.
Events reach the browser in seq order, each once: after `resume` the consumer reads every
stored event after the client's seq from the database, then follows the session live. The
live layer hands it each committed batch with its frames already encoded; the consumer sends
whatever continues from the last seq it sent, and reads the database again whenever it finds
a gap. One task (`_pump`) does all the sending, so frames never interleave.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from typing import Any, NamedTuple
from uuid import UUID

from channels.consumer import get_handler_name
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from craft import commands, services, workspace_paths
from craft.errors import Refused
from craft.live import delivery, status
from craft.live.accounts import FollowsAccount, signed_in_as
from craft.live.auth import authenticate
from craft.live.outbuffer import unsent_bytes
from craft.models import Session
from craft.storage.db import db_sync_to_async
from craft.storage.eventlog import frames_after
from craft.workspace_paths import Scrub
from sandboxes.models import Sandbox

logger = logging.getLogger(__name__)

# Close codes (4000-4999 are for applications).
CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_DELETED = 4404
CLOSE_TOO_SLOW = 4408
CLOSE_TOO_MANY_SOCKETS = 4429
REPLAY_PAGE = 2000
# While sending a long run of frames, let the event loop (and other sockets) in this often.
YIELD_EVERY = 256
# Live batches held for a socket that is busy sending; past this it reads the log instead.
BACKLOG_BATCHES = 1_000
# A `sessions` frame names at most this many changed sessions; past it, none (read them all).
CHANGED_SESSIONS_AT_MOST = 20


# What the channel layer may bring a session socket: the doorbell, the two closings and the
# person's status notices (craft.live.status). Anything else from the layer (a forged
# `websocket.receive` above all) is dropped.
LAYER_MESSAGES = {
    "events.available", "session.deleted", "account.closed",
    status.SANDBOX_CHANGED, status.SESSIONS_CHANGED, status.AGENT_STDERR,
}  # fmt: skip


class TooSlow(Exception):
    """The client did not read what it was sent for too long."""


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
def _sandbox_state(session_id: UUID) -> dict[str, str] | None:
    """The state of the session's sandbox now (a session whose sandbox was terminated moves
    to its owner's new one at its next prompt: the frames follow it)."""
    sandbox = Sandbox.objects.filter(sessions__pk=session_id).first()
    return None if sandbox is None else status.sandbox_state(sandbox)


@db_sync_to_async
def _mark_seen(user: Any, session_id: UUID) -> None:
    services.mark_seen(user, session_id)


@db_sync_to_async
def _frames_after(session_id: UUID, seq: int) -> list[tuple[int, str]]:
    return frames_after(session_id, seq, limit=REPLAY_PAGE)


class SessionConsumer(FollowsAccount, AsyncWebsocketConsumer):
    session_id: UUID
    sent_seq: int | None = None  # None until the client resumes: no events before that
    _known_seq = 0  # the highest seq known to be stored
    _backlog: deque[tuple[int, list[str]]] | None = None  # (first seq, frames) not sent yet
    _catch_up = False  # read the database after sent_seq before using the backlog
    _pump: asyncio.Task[None] | None = None
    _following = False
    # Replaces the workspace's host path in what this socket sends (None: staff see it).
    _scrub: Scrub | None = None
    _listening = False
    # The person's status (craft.live.status): what to read and send, and what was sent.
    _status_task: asyncio.Task[None] | None = None
    _sandbox_stale = False
    _sessions_stale = False
    # The sessions that changed since the last `sessions` frame; None: not known which.
    _changed_sessions: set[str] | None = None
    _follows_sessions = False  # until the client sends `follow_sessions`
    _sessions_missed = False  # a sessions notice came before `follow_sessions`
    _hello_sent = False  # no status frame before the `hello`
    _accepted = False  # the websocket handshake is answered
    _sandbox_sent: dict[str, str] | None = None
    # What this session's quiet agent last wrote to stderr (craft.live.status): to send, sent.
    _stderr_said: str | None = None
    _stderr_sent = ""

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
        # The handshake ends here, before any query: under load the reads below (the account
        # too) can wait for the database longer than the server waits for a handshake
        # (daphne's --websocket_connect_timeout), which would drop the socket. A refusal
        # below closes it with its code.
        await self.accept()
        self._accepted = True
        user = await authenticate(self.scope)
        if not user.is_authenticated:
            await self._refuse(CLOSE_UNAUTHENTICATED)
            return
        # Counted before any other query: a socket past the limit costs nothing more.
        if not self.hold_socket(user):
            await self._refuse(CLOSE_TOO_MANY_SOCKETS)
            return
        # Listen before reading: a sign-out (closes the socket, 4401) or a status change
        # (marks it stale until the hello) committed after the read below reaches this
        # socket, and the read sees whatever was committed before.
        await self.join_account(user)
        self.user = user
        status.listen(user.pk, self)
        self._listening = True
        auth_hash, session, self._scrub = await _opening(user, self.session_key, self.session_id)
        if auth_hash is None:
            await self._refuse(CLOSE_UNAUTHENTICATED)
            return
        if session is None:
            await self._refuse(CLOSE_FORBIDDEN)
            return
        self.watch_account(auth_hash)
        self.group = delivery.session_group(self.session_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        delivery.follow(self.session_id, self)
        self._following = True
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

    async def disconnect(self, code: int) -> None:
        # The turn goes on: only `cancel` stops it.
        await self.unfollow_account()
        if self._following:
            delivery.unfollow(self.session_id, self)
            self._following = False
        if self._listening:
            status.stop_listening(self.user.pk, self)
            self._listening = False
        if self._status_task is not None:
            self._status_task.cancel()
        if self._pump is not None:
            self._pump.cancel()
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
        if self._pump is not None:
            self._pump.cancel()
            await asyncio.gather(self._pump, return_exceptions=True)
            self._pump = None
        self.sent_seq = resume.after
        self._backlog = None
        self._catch_up = True
        self._start_pump()

    async def handle_seen(self, seen: commands.Seen) -> None:
        await _mark_seen(self.user, self.session_id)

    async def handle_follow_sessions(self, follow: commands.FollowSessions) -> None:
        self._follows_sessions = True
        if self._sessions_missed:
            # A change since this socket listened (its connect), before it followed: the
            # list the page holds may not show it. One frame now, as if it had followed.
            self.notice({"type": status.SESSIONS_CHANGED})

    # --- live events --------------------------------------------------------------------------

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
        self._start_pump()

    async def session_deleted(self, message: dict[str, Any]) -> None:
        """The session was deleted (here or in another process): say so and close."""
        await self.send_error("session_deleted", "this session was deleted")
        await self.close(code=CLOSE_DELETED)

    async def events_available(self, message: dict[str, Any]) -> None:
        """Another process stored events (the channel-layer doorbell): read them."""
        if message.get("origin") != delivery.PROCESS_ID:
            last = message["last_seq"]
            self.deliver(message.get("first_seq", last), last, message.get("frames"))

    # --- the person's status (craft.live.status) ---------------------------------------------

    def notice(self, message: dict[str, Any]) -> None:
        """Take a status notice (on the event loop) and send what it changed, once."""
        if message.get("type") == status.AGENT_STDERR:
            if message.get("session") != self.session_id.hex or not self._hello_sent:
                return  # another session's agent; or a line a later one replaces anyway
            text = message.get("text")
            self._stderr_said = text if isinstance(text, str) else ""
            self._start_status()
            return
        if message.get("type") == status.SANDBOX_CHANGED:
            self._sandbox_stale = True  # of this session's, or the one it is moving to
        elif self._follows_sessions:
            self._note_changed(message.get("session"))
            self._sessions_stale = True
        else:
            self._sessions_missed = True
            return
        if self._hello_sent:
            self._start_status()  # else the hello starts it, after itself

    def _note_changed(self, session: str | None) -> None:
        """Add a changed session to the next `sessions` frame: past `CHANGED_SESSIONS_AT_MOST`,
        or with one not named, the frame names none and the page reads its whole list."""
        if not self._sessions_stale:  # the first change since the last frame
            self._changed_sessions = set()
        changed = self._changed_sessions
        full = changed is not None and len(changed) >= CHANGED_SESSIONS_AT_MOST
        if changed is None or session is None or (full and session not in changed):
            self._changed_sessions = None
        else:
            changed.add(session)

    def _start_status(self) -> None:
        if self._status_task is None or self._status_task.done():
            self._status_task = asyncio.get_running_loop().create_task(self._send_status())

    async def _send_status(self) -> None:
        try:
            while self._sandbox_stale or self._sessions_stale or self._stderr_said is not None:
                if self._stderr_said is not None:
                    text, self._stderr_said = self.scrubbed(self._stderr_said), None
                    if text != self._stderr_sent:
                        self._stderr_sent = text
                        await self.send_json({"type": "agent_stderr", "text": text})
                if self._sandbox_stale:
                    self._sandbox_stale = False
                    state = await _sandbox_state(self.session_id)
                    if state is not None:
                        state["error"] = self.scrubbed(state["error"])
                    if state is not None and state != self._sandbox_sent:
                        self._sandbox_sent = state
                        await self.send_json({"type": "sandbox", **state})
                if self._sessions_stale:
                    self._sessions_stale = False
                    frame: dict[str, Any] = {"type": "sessions"}
                    if self._changed_sessions is not None:
                        frame["sessions"] = sorted(self._changed_sessions)
                    await self.send_json(frame)
        except Exception:
            logger.exception("session %s: sending the status failed", self.session_id)

    async def sandbox_changed(self, message: dict[str, Any]) -> None:
        """Another process changed one of the person's sandboxes (the layer's notice)."""
        if message.get("origin") != delivery.PROCESS_ID:
            self.notice(message)

    async def sessions_changed(self, message: dict[str, Any]) -> None:
        """Another process changed one of the person's sessions (the layer's notice)."""
        if message.get("origin") != delivery.PROCESS_ID:
            self.notice(message)

    async def agent_stderr(self, message: dict[str, Any]) -> None:
        """A quiet agent run by another process wrote to stderr (the layer's notice)."""
        if message.get("origin") != delivery.PROCESS_ID:
            self.notice(message)

    def _start_pump(self) -> None:
        if self._pump is None or self._pump.done():
            self._pump = asyncio.get_running_loop().create_task(self._pump_events())

    async def _pump_events(self) -> None:
        try:
            await self._send_pending()
        except TooSlow:
            self._backlog = None
            await self.close(code=CLOSE_TOO_SLOW)

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
        send = self.base_send
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
        limit = settings.CRAFT_SOCKET_BUFFER_BYTES
        unsent = unsent_bytes(self.base_send)
        if unsent is None or unsent <= limit:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + settings.CRAFT_SOCKET_STALL_SECONDS
        while (unsent_bytes(self.base_send) or 0) > limit // 2:
            if loop.time() > deadline:
                logger.info("session %s: a client stopped reading; closing", self.session_id)
                raise TooSlow
            await asyncio.sleep(0.05)

    # --- helpers ----------------------------------------------------------------------------

    async def send_json(self, content: dict[str, Any]) -> None:
        await self.send(text_data=json.dumps(content, ensure_ascii=False))

    async def send_error(self, code: str, message: str) -> None:
        await self.send_json({"type": "error", "code": code, "message": self.scrubbed(message)})

    def scrubbed(self, text: str) -> str:
        return text if self._scrub is None else self._scrub(text)
