"""The terminal websocket: a shell in a session's workspace (see docs/websocket-api.md).

`/ws/sessions/<id>/terminals/` starts a new shell (`sandboxes.terminals`, where and as the
session's agent runs); `?terminal=<tid>` goes back to one this process holds: its scrollback,
then live output. Authenticated and checked as the session socket is (the session cookie, the
Origin, the account followed), and only the session's owner. The shell's output is sent as
it is read (what piles up while a send is under way goes in the next frame), decoded as UTF-8
across reads, and the terminal is read further only once the client has taken what was sent
(a client past CRAFT_SOCKET_BUFFER_BYTES unread that reads nothing for
CRAFT_SOCKET_STALL_SECONDS is closed, 4408); what the person types is written to the terminal
and kept nowhere.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import logging
from typing import Any, NamedTuple
from urllib.parse import parse_qs
from uuid import UUID

from channels.consumer import get_handler_name
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from craft.live.accounts import signed_in_as
from craft.live.consumer import FromSocket
from craft.live.event_pump import CLOSE_TOO_SLOW
from craft.live.outbuffer import client_keeps_up
from craft.live.sign_in import CLOSE_TOO_MANY_SOCKETS, SignsIn
from craft.models import Session
from craft.storage.db import db_sync_to_async
from sandboxes import services as sandbox_services
from sandboxes.backends import SandboxError
from sandboxes.terminals import Terminal, TooManyTerminals, terminals

logger = logging.getLogger(__name__)

CLOSE_NO_TERMINAL = 4404
CLOSE_UNAVAILABLE = 4503
# The size of a new terminal unless the query says (`cols`, `rows`); the page resizes it.
DEFAULT_SIZE = (80, 24)
MAX_SIDE = 1000
# The most one `input` frame may carry (a paste); more is refused, not cut.
MAX_INPUT_CHARS = 256 * 1024
# What may wait for this socket, read from the terminal but not handed to the server yet.
MAX_PENDING_BYTES = 1 << 20
_OPEN = object()  # the terminal has not ended


class Opening(NamedTuple):
    auth_hash: str | None  # None: the browser session no longer signs the user in
    session: Session | None  # None: not the user's session (or none at all)


@db_sync_to_async
def _opening(user: Any, session_key: str | None, session_id: UUID) -> Opening:
    auth_hash = signed_in_as(session_key, user.pk)
    if auth_hash is None:
        return Opening(None, None)
    return Opening(auth_hash, Session.objects.one_of(user, session_id))


def _size(query: dict[str, list[str]]) -> tuple[int, int]:
    try:
        cols, rows = int(query["cols"][0]), int(query["rows"][0])
    except (KeyError, ValueError):
        return DEFAULT_SIZE
    if 1 <= cols <= MAX_SIDE and 1 <= rows <= MAX_SIDE:
        return cols, rows
    return DEFAULT_SIZE


class TerminalConsumer(SignsIn, AsyncWebsocketConsumer):
    """One socket on one terminal (a `sandboxes.terminals.Listener`)."""

    terminal: Terminal | None = None
    _pump: asyncio.Task[None] | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        async def from_socket() -> FromSocket:
            return FromSocket(await receive())

        await super().__call__(scope, from_socket, send)

    async def dispatch(self, message: dict[str, Any]) -> None:
        """Handle `websocket.*` from the client's socket only, and from the channel layer
        only the account's closing (as the session socket does)."""
        kind = str(message.get("type"))
        from_socket = isinstance(message, FromSocket)
        if from_socket != kind.startswith("websocket.") or (
            not from_socket and kind != "account.closed"
        ):
            logger.warning("terminal socket: dropped a %r message from the channel layer", kind)
            return
        await getattr(self, get_handler_name(message))(message)

    async def connect(self) -> None:
        self.session_id = self.scope["url_route"]["kwargs"]["session_id"]
        if not await self.sign_in():
            return
        user = self.user
        auth_hash, session = await _opening(user, self.session_key, self.session_id)
        if not await self.admit(auth_hash, session is not None):
            return
        assert session is not None
        query = parse_qs(self.scope.get("query_string", b"").decode("latin1"))
        wanted = query.get("terminal", [""])[0]
        if wanted:
            terminal = terminals.get(wanted, user.pk, self.session_id)
            if terminal is None:
                await self._refuse(
                    CLOSE_NO_TERMINAL,
                    "no_terminal",
                    "that terminal has ended (or is held by another server process)",
                )
                return
        else:
            try:
                sandbox_services.check_running(session.sandbox.status, session.sandbox.error)
                cols, rows = _size(query)
                terminal = await asyncio.to_thread(
                    terminals.open, user.pk, session.sandbox, self.session_id, cols, rows
                )
            except TooManyTerminals as exc:
                await self._refuse(CLOSE_TOO_MANY_SOCKETS, "too_many_terminals", str(exc))
                return
            except SandboxError as exc:
                code = "sandbox_unavailable"
                if not isinstance(exc, sandbox_services.SandboxUnavailable):
                    code = "terminal_failed"
                await self._refuse(CLOSE_UNAVAILABLE, code, str(exc))
                return
        self._attach(terminal)
        await self.send_json({"type": "ready", "terminal": terminal.id})
        self._pump = asyncio.get_running_loop().create_task(self._send_output())

    def _attach(self, terminal: Terminal) -> None:
        self._loop = asyncio.get_running_loop()
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._wake = asyncio.Event()
        self._exit: object = _OPEN
        self._too_slow = False
        self._live = 0  # bytes of live output taken and not sent yet (the terminal waits)
        scrollback, still_open = terminal.attach(self)
        self._pending = bytearray(scrollback)
        self.terminal = terminal
        if not still_open:
            self._exit = terminal.code
        self._wake.set()

    async def _refuse(self, close_code: int, code: str = "", message: str = "") -> None:
        await self.unfollow_account()
        if code:
            await self.send_json({"type": "error", "code": code, "message": message})
        await self.close(code=close_code)

    async def disconnect(self, code: int) -> None:
        await self.unfollow_account()
        if self.terminal is not None:
            self.terminal.detach(self)
        if self._pump is not None:
            self._pump.cancel()

    # --- from the terminal (on its reading thread) -------------------------------------------

    def output(self, data: bytes) -> None:
        self._loop.call_soon_threadsafe(self._take, data)

    def ended(self, code: int | None) -> None:
        self._loop.call_soon_threadsafe(self._take_exit, code)

    def _take(self, data: bytes) -> None:
        if len(self._pending) + len(data) > MAX_PENDING_BYTES:
            self._too_slow = True  # it comes back to the scrollback
        else:
            self._pending += data
            self._live += len(data)
        self._wake.set()

    def _take_exit(self, code: int | None) -> None:
        self._exit = code
        self._wake.set()

    async def _send_output(self) -> None:
        limit = settings.CRAFT_SOCKET_BUFFER_BYTES
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._too_slow:
                await self.close(code=CLOSE_TOO_SLOW)
                return
            if self._pending:
                data = bytes(self._pending)
                self._pending.clear()
                live, self._live = self._live, 0
                text = self._decoder.decode(data)
                if text:
                    await self.send_json({"type": "output", "data": text})
                stall = settings.CRAFT_SOCKET_STALL_SECONDS
                if not await client_keeps_up(self.base_send, limit, stall):
                    logger.info("terminal socket: the client stopped reading; closing")
                    await self.close(code=CLOSE_TOO_SLOW)
                    return
                if self.terminal is not None:
                    self.terminal.sent(self, live)  # the terminal is read further
            if self._exit is not _OPEN:
                text = self._decoder.decode(b"", final=True)
                if text:
                    await self.send_json({"type": "output", "data": text})
                await self.send_json({"type": "exit", "code": self._exit})
                await self.close()
                return

    # --- from the client ------------------------------------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.terminal is None:
            return
        if text_data is None:
            await self.send_error("bad_frame", "frames must be JSON text")
            return
        try:
            frame = json.loads(text_data)
        except (ValueError, RecursionError):
            await self.send_error("bad_json", "the frame is not valid JSON")
            return
        kind = frame.get("type") if isinstance(frame, dict) else None
        if kind == "input" and isinstance(frame.get("data"), str):
            await self.handle_input(frame["data"])
        elif kind == "resize" and _side(frame.get("cols")) and _side(frame.get("rows")):
            await self._blocking(self.terminal.resize, frame["cols"], frame["rows"])
        elif kind in ("input", "resize"):
            what = "a string 'data'" if kind == "input" else f"'cols' and 'rows' of 1 to {MAX_SIDE}"
            await self.send_error("bad_frame", f"an {kind!r} frame needs {what}")
        else:
            await self.send_error(
                "bad_frame", "a frame is a JSON object of type 'input' or 'resize'"
            )

    async def handle_input(self, data: str) -> None:
        assert self.terminal is not None
        if len(data) > MAX_INPUT_CHARS:
            await self.send_error("too_large", f"at most {MAX_INPUT_CHARS} characters a frame")
            return
        raw = data.encode("utf-8", errors="replace")
        try:
            await self._blocking(self.terminal.write, raw)
        except OSError as exc:
            await self.send_error("input_refused", f"the terminal took no input: {exc}")

    async def _blocking(self, call: Any, *args: Any) -> None:
        """Run `call` on a thread when the terminal's writes may wait (a pod exec's
        websocket), else at once (a local terminal's never block). Frames are handled one at
        a time, so keystrokes keep their order either way."""
        assert self.terminal is not None
        if self.terminal.process.writes_block:
            await asyncio.to_thread(call, *args)
        else:
            call(*args)

    # --- helpers ----------------------------------------------------------------------------

    async def send_json(self, content: dict[str, Any]) -> None:
        await self.send(text_data=json.dumps(content, ensure_ascii=False))

    async def send_error(self, code: str, message: str) -> None:
        await self.send_json({"type": "error", "code": code, "message": message})


def _side(value: Any) -> bool:
    return type(value) is int and 1 <= value <= MAX_SIDE
