"""Session runners: one per live session in this process, owning its agent turns.

A runner runs each turn as a background task on the event loop, never inside a consumer's
`receive`, so a browser that leaves does not stop the turn and `cancel` is always heard. It
persists every item of the turn in wire order (batching what has piled up into one
transaction) and the event log rings the doorbell after each commit.

One turn at a time per session: a prompt that arrives while a turn runs is refused with the
error code `turn_running` (the page disables its Send button meanwhile); queueing would make a
stale prompt run minutes later, which surprises people more than a clear refusal.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django.conf import settings

from sandboxes import services as sandbox_services
from sandboxes.acp import (
    AgentConnection,
    AgentError,
    PermissionRequest,
    TurnEnd,
    TurnFailed,
    Update,
)

from .db import db_sync_to_async
from .eventlog import append_events
from .models import Event, Session

logger = logging.getLogger(__name__)

MAX_PROMPT_CHARS = 100_000
BATCH_LIMIT = 200


class Refused(Exception):
    """A client request that was not accepted; `code` goes into the websocket error frame."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@db_sync_to_async
def _store(session_id: UUID, events: list[tuple[str, dict[str, Any]]]) -> None:
    append_events(session_id, events)


@db_sync_to_async
def _prompt_seen(session_id: UUID, client_id: str) -> bool:
    return Event.objects.filter(
        session_id=session_id, kind="user_message", data__id=client_id
    ).exists()


@db_sync_to_async
def _connect(session_id: UUID) -> AgentConnection:
    session = Session.objects.select_related("sandbox").get(pk=session_id)
    connection = sandbox_services.connect_agent(session.sandbox, session.pk)
    if connection.agent_session_id and connection.agent_session_id != session.agent_session_id:
        Session.objects.filter(pk=session.pk).update(agent_session_id=connection.agent_session_id)
    return connection


def _ends(item: Any) -> bool:
    return isinstance(item, TurnEnd | TurnFailed)


@dataclass
class _Pending:
    options: set[str]


class SessionRunner:
    """Run one session's turns; all methods are called on the event loop."""

    def __init__(self, session_id: UUID) -> None:
        self.session_id = session_id
        self.connection: AgentConnection | None = None
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._pending: dict[str, _Pending] = {}
        self._cancel_requested = False
        # The running turn's queue of items; late updates join it while it is being stored.
        self._items: asyncio.Queue[Any] | None = None
        self._late_stores: set[asyncio.Task[None]] = set()  # keeps them from being collected

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def prompt(self, client_id: str, text: str) -> bool:
        """Store the prompt and start its turn; return False for a repeated client id."""
        if not text.strip():
            raise Refused("empty_prompt", "a prompt needs some text")
        if len(text) > MAX_PROMPT_CHARS:
            raise Refused(
                "prompt_too_long", f"prompts are limited to {MAX_PROMPT_CHARS} characters"
            )
        async with self._lock:
            if await _prompt_seen(self.session_id, client_id):
                return False
            if self.running:
                raise Refused("turn_running", "the agent is still working on the previous prompt")
            await _store(self.session_id, [("user_message", {"id": client_id, "text": text})])
            self._cancel_requested = False
            # A fresh context: the turn must not inherit the consumer's thread-sensitive
            # context, which ends (and shuts its executor down) when the browser leaves.
            self._task = asyncio.get_running_loop().create_task(
                self._run_turn(text), context=contextvars.Context()
            )
        return True

    async def cancel(self) -> None:
        """Cancel the running turn; it ends with stop reason `cancelled`."""
        if not self.running:
            raise Refused("not_running", "no turn is running")
        self._cancel_requested = True
        answered = list(self._pending)
        self._pending.clear()
        if answered:
            await _store(
                self.session_id,
                [
                    ("permission_answer", {"request": rid, "option": None, "outcome": "cancelled"})
                    for rid in answered
                ],
            )
        if self.connection is not None:
            await asyncio.to_thread(self.connection.cancel)
            task = self._task
            asyncio.get_running_loop().create_task(
                self._stop_if_still_running(task, self.connection), context=contextvars.Context()
            )

    async def _stop_if_still_running(
        self, task: asyncio.Task[None] | None, connection: AgentConnection
    ) -> None:
        """Stop an agent that ignores `session/cancel`, so that cancel always ends the turn.

        Its connection dies with it; the next prompt starts a new agent.
        """
        if task is None:
            return
        grace = settings.CRAFT_CANCEL_GRACE_SECONDS
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout=grace)
        except TimeoutError:
            logger.warning(
                "session %s: agent ignored cancel for %s s; stopping it", self.session_id, grace
            )
            await asyncio.to_thread(connection.stop)

    async def answer_permission(self, request_id: str, option_id: str) -> None:
        """Answer the agent's permission request with one of its options."""
        pending = self._pending.get(request_id)
        if pending is None or self.connection is None:
            raise Refused("unknown_request", "that permission request is not open")
        if option_id not in pending.options:
            raise Refused("invalid_option", f"{option_id!r} is not an option of that request")
        del self._pending[request_id]
        # Stored before the agent hears it, so the log never shows the agent acting on an
        # answer that comes later in the log.
        await _store(
            self.session_id,
            [("permission_answer", {"request": request_id, "option": option_id})],
        )
        await asyncio.to_thread(self.connection.answer_permission, request_id, option_id)

    async def _run_turn(self, text: str) -> None:
        """Run one turn to its end; whatever happens, the log gets exactly one turn_end."""
        self.connection = None  # until this turn has its own (usually the cached one)
        try:
            try:
                self.connection = await _connect(self.session_id)
            except Exception as exc:
                logger.warning("session %s: agent did not start: %s", self.session_id, exc)
                await self._end([("agent_error", {"message": str(exc)})], "error")
                return
            if self._cancel_requested:
                await self._end([], "cancelled")
                return
            self._keep_late_updates(self.connection)
            await self._stream(self.connection, text)
        except AgentError as exc:
            # The agent went away between the cache handing it out and the prompt.
            await self._end([("agent_error", {"message": str(exc)})], "error")
        except Session.DoesNotExist:
            logger.info("session %s was deleted during a turn", self.session_id)
        except Exception as exc:
            logger.exception("session %s: turn failed", self.session_id)
            try:
                await self._end([("agent_error", {"message": f"internal error: {exc}"})], "error")
            except Exception:
                logger.exception("session %s: could not record the failed turn", self.session_id)
        finally:
            self._pending.clear()

    def _keep_late_updates(self, connection: AgentConnection) -> None:
        """Store updates that arrive outside a turn (some agents send them after the prompt
        response), in arrival order: while the turn's stream is still being stored they join
        its queue, afterwards each is stored on its own, after everything before it."""
        loop = asyncio.get_running_loop()

        def on_late(item: Any) -> None:  # on the event loop
            if not isinstance(item, Update):
                return
            if self._items is not None:
                self._items.put_nowait(item)
            else:
                task = loop.create_task(_store(self.session_id, [(item.kind, item.data)]))
                self._late_stores.add(task)
                task.add_done_callback(self._late_stores.discard)

        def idle_sink(item: Any) -> None:  # on the connection's reader thread
            loop.call_soon_threadsafe(on_late, item)

        connection.idle_sink = idle_sink

    async def _stream(self, connection: AgentConnection, text: str) -> None:
        loop = asyncio.get_running_loop()
        items: asyncio.Queue[Any] = asyncio.Queue()
        self._items = items

        def sink(item: Any) -> None:
            loop.call_soon_threadsafe(items.put_nowait, item)

        try:
            # Writing the prompt can block (a full pipe, a slow exec websocket): not on the loop.
            await asyncio.to_thread(connection.prompt, text, sink)
            while True:
                batch = [await items.get()]
                # Batch what has piled up, but never past the end of the turn: anything after
                # it is a late update and belongs after the turn_end event.
                while not items.empty() and len(batch) < BATCH_LIMIT and not _ends(batch[-1]):
                    batch.append(items.get_nowait())
                events, final = self._events_of(batch)
                if final is not None:
                    await self._end(events, final)
                    break
                await _store(self.session_id, events)
            # Updates that came after the prompt response while the end was being stored.
            while not items.empty():
                late, _ = self._events_of([items.get_nowait()])
                await _store(self.session_id, late)
        finally:
            self._items = None

    def _events_of(self, batch: list[Any]) -> tuple[list[tuple[str, dict[str, Any]]], str | None]:
        """Turn items into events; return them and the stop reason if the turn ended."""
        events: list[tuple[str, dict[str, Any]]] = []
        final: str | None = None
        for item in batch:
            if isinstance(item, Update):
                events.append((item.kind, item.data))
            elif isinstance(item, PermissionRequest):
                self._pending[item.request_id] = _Pending(
                    {str(o.get("optionId")) for o in item.options}
                )
                events.append(
                    (
                        "permission_request",
                        {
                            "request": item.request_id,
                            "toolCall": item.tool_call,
                            "options": item.options,
                        },
                    )
                )
            elif isinstance(item, TurnEnd):
                final = item.stop_reason
            elif isinstance(item, TurnFailed):
                events.append(("agent_error", {"message": item.message}))
                final = "error"
        return events, final

    async def _end(self, events: list[tuple[str, dict[str, Any]]], stop_reason: str) -> None:
        self._pending.clear()
        await _store(self.session_id, [*events, ("turn_end", {"stop_reason": stop_reason})])


class RunnerRegistry:
    """The runners of this process, by session id (used from the event loop only)."""

    def __init__(self) -> None:
        self._runners: dict[UUID, SessionRunner] = {}

    def get(self, session_id: UUID) -> SessionRunner:
        runner = self._runners.get(session_id)
        if runner is None:
            runner = self._runners[session_id] = SessionRunner(session_id)
        return runner

    def is_running(self, session_id: UUID) -> bool:
        runner = self._runners.get(session_id)
        return runner is not None and runner.running

    def forget(self, session_id: UUID) -> None:
        self._runners.pop(session_id, None)

    def clear(self) -> None:
        self._runners.clear()


runners = RunnerRegistry()
