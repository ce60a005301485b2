"""The session websocket (API v1, see docs/websocket-api.md).

The consumer authenticates, authorises, and hands each frame to the session's runner; it
never runs a turn itself. Events reach the browser from the database: after `resume` the
consumer sends every stored event after the client's seq, then whatever the doorbell
announces, always continuing from the last seq it sent. A consumer handles one message at a
time, so a doorbell that rings during a replay is handled after it, and finds only the events
the replay did not already send: no gap, no duplicate.
"""

from __future__ import annotations

import json
import logging
from typing import Any
from uuid import UUID

from channels.generic.websocket import AsyncWebsocketConsumer

from . import services
from .db import db_sync_to_async
from .eventlog import events_after
from .live import session_group
from .models import Event, Session
from .runner import Refused, runners

logger = logging.getLogger(__name__)

# Close codes (4000-4999 are for applications).
CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
REPLAY_PAGE = 500


@db_sync_to_async
def _owned_session(user: Any, session_id: UUID) -> Session | None:
    return Session.objects.select_related("sandbox").filter(pk=session_id, owner=user).first()


@db_sync_to_async
def _last_seq(session_id: UUID) -> int:
    return Session.objects.filter(pk=session_id).values_list("last_seq", flat=True).first() or 0


@db_sync_to_async
def _events_after(session_id: UUID, seq: int) -> list[Event]:
    return events_after(session_id, seq, limit=REPLAY_PAGE)


def event_frame(event: Event) -> dict[str, Any]:
    return {"type": "event", "seq": event.seq, "kind": event.kind, "data": event.data}


class SessionConsumer(AsyncWebsocketConsumer):
    session_id: UUID
    sent_seq: int | None  # None until the client resumes: no events before that

    async def connect(self) -> None:
        user = self.scope.get("user")
        self.session_id = self.scope["url_route"]["kwargs"]["session_id"]
        self.sent_seq = None
        # Accept first: a close code only reaches the client on an accepted websocket.
        if user is None or not user.is_authenticated:
            await self.accept()
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        session = await _owned_session(user, self.session_id)
        if session is None:
            await self.accept()
            await self.close(code=CLOSE_FORBIDDEN)
            return
        self.group = session_group(self.session_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        await self.send_json(
            {
                "type": "hello",
                "session": str(self.session_id),
                "last_seq": session.last_seq,
                "running": runners.is_running(self.session_id),
                "sandbox": {
                    "status": session.sandbox.status,
                    "detail": session.sandbox.status_detail,
                    "error": session.sandbox.error,
                },
            }
        )

    async def disconnect(self, code: int) -> None:
        # The turn goes on: only `cancel` stops it.
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
        if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
            await self.send_error("bad_frame", "a frame is a JSON object with a string 'type'")
            return
        handler = self.handlers.get(frame["type"])
        if handler is None:
            await self.send_error("unknown_type", f"unknown frame type {frame['type']!r}")
            return
        try:
            await handler(self, frame)
        except Refused as refused:
            await self.send_error(refused.code, refused.message)

    # --- client frames ----------------------------------------------------------------------

    async def handle_prompt(self, frame: dict[str, Any]) -> None:
        client_id, text = frame.get("id"), frame.get("text")
        if not isinstance(client_id, str) or not client_id or len(client_id) > 100:
            raise Refused("bad_frame", "prompt needs an 'id' string (at most 100 characters)")
        if not isinstance(text, str):
            raise Refused("bad_frame", "prompt needs a 'text' string")
        await services.post_prompt(self.session_id, client_id, text)

    async def handle_cancel(self, frame: dict[str, Any]) -> None:
        await services.cancel_turn(self.session_id)

    async def handle_permission(self, frame: dict[str, Any]) -> None:
        request_id, option_id = frame.get("request"), frame.get("option")
        if not isinstance(request_id, str) or not isinstance(option_id, str):
            raise Refused("bad_frame", "permission needs 'request' and 'option' strings")
        await services.answer_permission(self.session_id, request_id, option_id)

    async def handle_resume(self, frame: dict[str, Any]) -> None:
        after = frame.get("after", 0)
        if isinstance(after, bool) or not isinstance(after, int) or after < 0:
            raise Refused("bad_frame", "resume needs 'after': a non-negative integer")
        self.sent_seq = after
        await self.send_new_events()

    handlers = {
        "prompt": handle_prompt,
        "cancel": handle_cancel,
        "permission": handle_permission,
        "resume": handle_resume,
    }

    # --- channel layer messages -------------------------------------------------------------

    async def events_available(self, message: dict[str, Any]) -> None:
        if self.sent_seq is not None and message["last_seq"] > self.sent_seq:
            await self.send_new_events()

    # --- helpers ----------------------------------------------------------------------------

    async def send_new_events(self) -> None:
        """Send every stored event after `sent_seq`, in order, advancing `sent_seq`."""
        assert self.sent_seq is not None
        while True:
            events = await _events_after(self.session_id, self.sent_seq)
            for event in events:
                await self.send_json(event_frame(event))
                self.sent_seq = event.seq
            if len(events) < REPLAY_PAGE:
                return

    async def send_json(self, content: dict[str, Any]) -> None:
        await self.send(text_data=json.dumps(content, ensure_ascii=False))

    async def send_error(self, code: str, message: str) -> None:
        await self.send_json({"type": "error", "code": code, "message": message})
