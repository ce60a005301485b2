"""The status socket: `/ws/status/`, for the pages that have no session socket (the home page).

It tells a signed-in person's page what the session socket's status frames tell a session's
page (craft.live.status): `{"type": "sessions", "sessions": [ids]}` when some of their
sessions changed what the list shows (no `sessions`: fetch the whole list), and
`{"type": "sandbox"}` when one of their sandboxes changed (the page fetches its sandbox line).
It says *that* something changed, never what: the page reads it over HTTP, as the session
page does. It opens with `{"type": "hello"}`, follows the account as every socket does
(closed with 4401 when the right to it ends, see craft.live.accounts) and counts towards
`CRAFT_MAX_SOCKETS_PER_USER` (4429 past it). The client sends nothing; what it sends is
ignored.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from craft.live import status
from craft.live.accounts import signed_in_as
from craft.live.delivery import PROCESS_ID
from craft.live.session_status import sessions_frame, with_changed
from craft.live.sign_in import SignsIn
from craft.storage.db import db_calls

logger = logging.getLogger(__name__)

# What may reach this socket: its own websocket's messages, and from the channel layer only
# these (whoever else can write to the layer cannot act for this user).
LAYER_MESSAGES = {
    "account.closed", status.SANDBOX_CHANGED, status.SESSIONS_CHANGED, status.AGENT_STDERR,
}  # fmt: skip


class StatusConsumer(SignsIn, AsyncJsonWebsocketConsumer):
    _listening = False
    _sending: asyncio.Task[None] | None = None
    _sandbox_stale = False
    _sessions_stale = False
    _changed: set[str] | None = None  # the sessions of the next frame; None: not known which

    async def dispatch(self, message: dict[str, Any]) -> None:
        kind = str(message.get("type"))
        if not kind.startswith("websocket.") and kind not in LAYER_MESSAGES:
            logger.warning("status socket: dropped a %r message from the channel layer", kind)
            return
        await super().dispatch(message)

    async def connect(self) -> None:
        if not await self.sign_in():
            return
        # Listen before the check below: what changes after it reaches this socket.
        status.listen(self.user.pk, self)
        self._listening = True
        auth_hash = await db_calls.run(signed_in_as, self.session_key, self.user.pk)
        if not await self.admit(auth_hash):
            return
        await self.send_json({"type": "hello"})

    async def _refuse(self, code: int) -> None:
        await self._stop_listening()
        await self.close(code=code)

    async def disconnect(self, code: int) -> None:
        await self._stop_listening()

    async def _stop_listening(self) -> None:
        await self.unfollow_account()
        if self._listening:
            status.stop_listening(self.user.pk, self)
            self._listening = False

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        pass  # the client has nothing to say here

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        pass  # not even what is not JSON

    def notice(self, message: dict[str, Any]) -> None:
        """Take a status notice (on the event loop): one frame per kind, for a burst."""
        kind = message.get("type")
        if kind == status.SANDBOX_CHANGED:
            self._sandbox_stale = True
        elif kind == status.SESSIONS_CHANGED:
            self._changed = with_changed(
                self._changed, not self._sessions_stale, message.get("session")
            )
            self._sessions_stale = True
        else:
            return  # a quiet agent's stderr is for its session's page
        if self._sending is None or self._sending.done():
            self._sending = asyncio.get_running_loop().create_task(self._send())

    async def _send(self) -> None:
        try:
            while self._sandbox_stale or self._sessions_stale:
                if self._sessions_stale:
                    self._sessions_stale = False
                    await self.send_json(sessions_frame(self._changed))
                if self._sandbox_stale:
                    self._sandbox_stale = False
                    await self.send_json({"type": "sandbox"})
        except Exception:
            logger.exception("status socket of user %s: sending failed", self.user.pk)

    async def sandbox_changed(self, message: dict[str, Any]) -> None:
        if message.get("origin") != PROCESS_ID:  # this process's were handed over directly
            self.notice(message)

    async def sessions_changed(self, message: dict[str, Any]) -> None:
        if message.get("origin") != PROCESS_ID:
            self.notice(message)

    async def agent_stderr(self, message: dict[str, Any]) -> None:
        pass
