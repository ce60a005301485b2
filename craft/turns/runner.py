"""Session runners: one per live session in this process, owning its agent turns.

A runner runs each turn as a background task on the event loop, never inside a consumer's
`receive`, so a browser that leaves does not stop the turn and `cancel` is always heard. It
stores every item of the turn in wire order through the event log's writer, which batches
whatever has piled up into one transaction and hands the frames to live sockets after commit.

Where the work runs: the agent's reader thread parses its output and drops items into the
runner's `Inbox`, waking the event loop once per batch rather than once per item. Starting an
agent (spawn, `initialize`, `session/new`: up to tens of seconds on Kubernetes) and every write
to an agent run on `agent_threads`, never on the database threads, so a slow agent never
delays another session's storage. A follow-up prompt reuses the runner's live connection
without touching the database or the connection cache.

One turn at a time per session: a prompt that arrives while a turn runs is refused with the
error code `turn_running` (the page disables its Send button meanwhile); queueing would make a
stale prompt run minutes later, which surprises people more than a clear refusal.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar
from uuid import UUID

from django.conf import settings
from django.db import DataError, IntegrityError

from craft.models import Event, Session
from craft.storage.db import db_sync_to_async
from craft.storage.eventlog import Fence, Fenced, Stored, writer
from craft.storage.normalise import clean_text, clean_title
from craft.turns import controls
from craft.turns.inbox import Inbox
from craft.turns.recovery import close_turns_of_gone_workers
from sandboxes import services as sandbox_services
from sandboxes.acp import (
    AgentConnection,
    AgentError,
    PermissionRequest,
    PromptNotSent,
    TurnEnd,
    TurnFailed,
    TurnItem,
    Update,
)
from sandboxes.models import Sandbox

logger = logging.getLogger(__name__)

T = TypeVar("T")

MAX_PROMPT_CHARS = 100_000
BATCH_LIMIT = 500
DEFAULT_TITLE = "New session"
TITLE_CHARS = 80
# A sandbox's activity time is written at most this often (it feeds idle reaping, not the UI).
ACTIVITY_EVERY = 60.0

# Agent starts and agent writes: blocking, possibly slow, never on the database threads.
agent_threads = ThreadPoolExecutor(max_workers=64, thread_name_prefix="craft-agent")


async def in_agent_thread(func: Callable[..., T], *args: Any) -> T:
    """Run blocking agent work on `agent_threads` (which never touch the database)."""
    return await asyncio.get_running_loop().run_in_executor(agent_threads, func, *args)


class Refused(Exception):
    """A client request that was not accepted; `code` goes into the websocket error frame."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@db_sync_to_async
def _prompt_seen(session_id: UUID, client_id: str) -> bool:
    return Event.objects.filter(session_id=session_id, client_id=client_id).exists()


@db_sync_to_async
def _sandbox_status(session_id: UUID) -> str | None:
    return Sandbox.objects.filter(sessions__pk=session_id).values_list("status", flat=True).first()


@db_sync_to_async
def _start_of(session_id: UUID) -> tuple[Sandbox, str]:
    """Return the session's sandbox, checked to be running, and the agent's last session id
    (empty at the session's first start)."""
    session = Session.objects.select_related("sandbox").get(pk=session_id)
    sandbox_services.require_running(session.sandbox)
    return session.sandbox, session.agent_session_id


@db_sync_to_async
def _record_start(session_id: UUID, sandbox_id: UUID, agent_session_id: str | None) -> None:
    sandbox_services.touch_sandbox(sandbox_id)
    if agent_session_id:
        Session.objects.filter(pk=session_id).exclude(agent_session_id=agent_session_id).update(
            agent_session_id=agent_session_id
        )


@db_sync_to_async
def _take_title(session_id: UUID, text: str) -> str | None:
    """Name a session after its first prompt unless it already has a name; return the name."""
    title = clean_title(text, TITLE_CHARS + 1)
    if len(title) > TITLE_CHARS:
        title = title[: TITLE_CHARS - 1].rstrip() + "…"
    if not title:
        return None
    updated = Session.objects.filter(pk=session_id, title=DEFAULT_TITLE).update(title=title)
    return title if updated else None


@dataclass
class _Pending:
    options: set[str]


class StorageFailed(Exception):
    """Events of a turn could not be stored; `unsaved` holds them, in order."""

    def __init__(self, cause: BaseException, unsaved: list[tuple[str, dict[str, Any]]]) -> None:
        super().__init__(str(cause))
        self.unsaved = unsaved


STORAGE_FAILED = "Craft could not store the agent's output, so it stopped the agent."
SHUTTING_DOWN = "The server shut down during this turn."
LOST_EVENTS = "updates of the agent could not be stored and were dropped."


class SessionRunner:
    """Run one session's turns; all methods are called on the event loop."""

    def __init__(self, session_id: UUID, registry: RunnerRegistry) -> None:
        self.session_id = session_id
        self.registry = registry
        self.connection: AgentConnection | None = None
        self._sandbox_id: UUID | None = None
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._pending: dict[str, _Pending] = {}
        self._cancel_requested = False
        self._interrupt: str | None = None  # why Craft cut the running turn short
        self._inbox: Inbox | None = None
        self._late: asyncio.Task[None] | None = None  # storing updates that came after a turn
        self._titled = False
        self._active_at = 0.0
        # (worker, token) of the lease under which this worker runs the session; set by
        # craft.cluster.ownership before each frame it handles here.
        self.fence: Fence | None = None
        self._starting = asyncio.Lock()  # one agent start at a time (a turn, a control)
        # What the last agent of this runner takes in prompts (None: not known yet).
        self._prompt_capabilities: dict[str, bool] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def busy(self) -> bool:
        """Whether a frame is being handled or an agent started here right now (a prompt
        being stored has no turn yet, and may have no agent yet)."""
        return self.running or self._lock.locked() or self._starting.locked()

    @property
    def task(self) -> asyncio.Task[None] | None:
        return self._task

    async def _append(
        self, events: list[tuple[str, dict[str, Any]]], *, client_id: str | None = None
    ) -> Stored | None:
        """Store events of this session under this worker's lease (see craft.cluster.ownership)."""
        return await writer.append(self.session_id, events, client_id=client_id, fence=self.fence)

    async def lose(self) -> None:
        """This worker lost the session's lease: stop its agent; store nothing more (the
        fence it holds is refused by the event log from now on)."""
        logger.warning("session %s: lease lost; stopping its agent here", self.session_id)
        await self._drop_connection()

    async def prompt(
        self, client_id: str, text: str, attachments: list[controls.Attachment] | None = None
    ) -> bool:
        """Store the prompt and start its turn; return False for a repeated client id.

        `attachments` (checked by `controls.parse_attachments`) go to the agent after the
        text; the log keeps what they were, not an image's bytes.
        """
        if not text.strip():
            raise Refused("empty_prompt", "a prompt needs some text")
        if len(text) > MAX_PROMPT_CHARS:
            raise Refused(
                "prompt_too_long", f"prompts are limited to {MAX_PROMPT_CHARS} characters"
            )
        attachments = attachments or []
        if attachments and self._prompt_capabilities is not None:
            try:
                controls.check_capabilities(attachments, self._prompt_capabilities)
            except controls.Invalid as invalid:
                raise Refused(invalid.code, invalid.message) from None
        # The agent gets the prompt as it is stored: text no one could encode is cleaned.
        text = clean_text(text)
        async with self._lock:
            if self.registry.closing:
                raise Refused("shutting_down", "the server is restarting; send it again soon")
            if self.connection is None and await _sandbox_status(self.session_id) == (
                Sandbox.Status.PROVISIONING
            ):  # nothing is stored: the page keeps the message until the sandbox is ready
                raise Refused(
                    "sandbox_starting", "your sandbox is still starting: send it when it is ready"
                )
            if self.running:
                if await _prompt_seen(self.session_id, client_id):
                    return False  # a resend of the prompt that started this turn
                raise Refused("turn_running", "the agent is still working on the previous prompt")
            if self._late is not None:
                await asyncio.gather(self._late, return_exceptions=True)
            stored = await self._store_prompt(client_id, text, attachments)
            if stored is None:
                return False
            self._cancel_requested = False
            self._interrupt = None
            # A fresh context: the turn must not inherit the consumer's context, which ends
            # when the browser leaves.
            self._task = asyncio.get_running_loop().create_task(
                self._run_turn(text, attachments), context=contextvars.Context()
            )
        if not self._titled:
            self._titled = True
            title = await _take_title(self.session_id, text)
            if title is not None:
                await self._append([("session_title", {"title": title, "source": "prompt"})])
        return True

    async def _store_prompt(
        self, client_id: str, text: str, attachments: list[controls.Attachment] | None = None
    ) -> Stored | None:
        """Store the user_message, which starts the session's durable turn.

        The database refuses a second running turn (another worker's, or one whose worker
        is gone and not yet closed: that one is closed here and the prompt stored after it).
        """
        data: dict[str, Any] = {"id": client_id, "text": text}
        if attachments:
            data["attachments"] = [attachment.stored() for attachment in attachments]
        event = [("user_message", data)]
        try:
            return await self._append(event, client_id=client_id)
        except IntegrityError:
            if not await db_sync_to_async(close_turns_of_gone_workers)(self.session_id):
                raise Refused(
                    "turn_running", "the agent is still working on the previous prompt"
                ) from None
        try:
            return await self._append(event, client_id=client_id)
        except IntegrityError:
            raise Refused(
                "turn_running", "the agent is still working on the previous prompt"
            ) from None

    async def cancel(self) -> None:
        """Cancel the running turn; it ends with stop reason `cancelled`."""
        if not self.running:
            raise Refused("not_running", "no turn is running")
        self._cancel_requested = True
        await self._answer_open_requests_cancelled()
        # If the agent has no turn yet (it is starting, or the prompt is being written), the
        # turn checks `_cancel_requested` once the prompt is out: either way the agent hears.
        if self.connection is not None:
            await self._send_cancel(self.connection)

    async def _answer_open_requests_cancelled(self) -> None:
        answered = list(self._pending)
        self._pending.clear()
        if answered:
            await self._append(
                [
                    ("permission_answer", {"request": rid, "option": None, "outcome": "cancelled"})
                    for rid in answered
                ],
            )

    async def _send_cancel(self, connection: AgentConnection) -> None:
        await in_agent_thread(connection.cancel)
        task = self._task
        asyncio.get_running_loop().create_task(
            self._stop_if_still_running(task, connection), context=contextvars.Context()
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
            await in_agent_thread(connection.stop)

    async def interrupt(self, why: str) -> None:
        """Cut the running turn short (the server is shutting down): it ends `interrupted`,
        saying `why`, with its open permission requests answered `cancelled`. The agent is
        asked to cancel; the caller stops it."""
        if not self.running:
            return
        self._interrupt = why
        self._cancel_requested = True
        connection = self.connection
        if connection is not None:
            await in_agent_thread(connection.cancel)

    async def answer_permission(self, request_id: str, option_id: str) -> None:
        """Answer the agent's permission request with one of its options."""
        pending = self._pending.get(request_id)
        connection = self.connection
        if pending is None or connection is None:
            raise Refused("unknown_request", "that permission request is not open")
        if option_id not in pending.options:
            raise Refused("invalid_option", f"{option_id!r} is not an option of that request")
        del self._pending[request_id]
        # Stored before the agent hears it, so the log never shows the agent acting on an
        # answer that comes later in the log.
        await self._append([("permission_answer", {"request": request_id, "option": option_id})])
        await in_agent_thread(connection.answer_permission, request_id, option_id)

    # --- the turn ---------------------------------------------------------------------------

    async def _connection(self) -> AgentConnection:
        """Return the session's live agent connection: this runner's, or the cache's."""
        cached = self.connection
        if cached is not None and cached.is_running:
            if time.monotonic() - self._active_at > ACTIVITY_EVERY and self._sandbox_id:
                self._active_at = time.monotonic()
                await db_sync_to_async(sandbox_services.touch_sandbox)(self._sandbox_id)
            return cached
        self.connection = None
        async with self._starting:
            if self.connection is not None and self.connection.is_running:
                return self.connection  # started meanwhile, for a control or a turn
            return await self._start_connection()

    async def _start_connection(self) -> AgentConnection:
        """Start the session's agent, reattached to its earlier agent session if any.

        Database work on the database threads, the agent's start on an agent thread: a start
        that takes seconds holds no database connection. The start's events (one
        `agent_restarted` if an earlier agent process was replaced, and `agent_info`) are
        queued before anything the agent sends outside a turn.
        """
        sandbox, reattach = await _start_of(self.session_id)
        connection = await in_agent_thread(
            sandbox_services.agent_connection, sandbox, self.session_id, reattach or None
        )
        self._sandbox_id = sandbox.pk
        await _record_start(self.session_id, sandbox.pk, connection.agent_session_id)
        self._active_at = time.monotonic()
        self._prompt_capabilities = connection.prompt_capabilities
        if controls.first_use(connection):
            await self._append(controls.start_events(connection))
        inbox = Inbox(asyncio.get_running_loop(), self._store_late_updates)
        connection.idle_sink = inbox.put
        self._inbox = inbox
        self.connection = connection
        return connection

    async def _run_turn(
        self, text: str, attachments: list[controls.Attachment] | None = None
    ) -> None:
        """Run one turn to its end; whatever happens, the log gets exactly one turn_end."""
        ending: list[tuple[str, dict[str, Any]]] = []
        try:
            try:
                connection = await self._connection()
            except Exception as exc:
                logger.warning("session %s: agent did not start: %s", self.session_id, exc)
                ending, reason = [("agent_error", {"message": str(exc)})], "error"
            else:
                if self._cancel_requested:
                    ending, reason = [], "cancelled"
                else:
                    ending, reason = await self._send_turn(connection, text, attachments or [])
        except Fenced:
            # Another worker took the session over; it closed this turn. Nothing more here.
            await self._drop_connection()
            return
        except StorageFailed as failure:
            logger.exception("session %s: storing the turn failed", self.session_id)
            await self._drop_connection()
            # Keep what the agent said before it was stopped: it goes in with the end.
            drained = self._drain_inbox()
            ending = [*failure.unsaved, *drained, ("agent_error", {"message": STORAGE_FAILED})]
            reason = "interrupted"
        except Exception as exc:
            logger.exception("session %s: turn failed", self.session_id)
            await self._drop_connection()
            ending, reason = [("agent_error", {"message": f"internal error: {exc}"})], "error"
        if self._interrupt is not None:
            ending, reason = [*ending, ("agent_error", {"message": self._interrupt})], "interrupted"
        await self._end(ending, reason)

    async def _send_turn(
        self, connection: AgentConnection, text: str, attachments: list[controls.Attachment]
    ) -> tuple[list[tuple[str, dict[str, Any]]], str]:
        """Stream the turn; if the prompt could not even be written (the agent died just
        before), the agent never got it: a new agent takes it, once."""
        for attempt in (1, 2):
            try:
                controls.check_capabilities(attachments, connection.prompt_capabilities)
            except controls.Invalid as invalid:
                return [("agent_error", {"message": invalid.message})], "error"
            blocks = controls.prompt_blocks(attachments, connection.cwd)
            try:
                return await self._stream(connection, text, blocks)
            except PromptNotSent as exc:
                logger.info("session %s: prompt not sent (%s)", self.session_id, exc)
                await self._drop_connection()
                if attempt == 2 or self._cancel_requested:
                    message = f"the agent could not take the prompt: {exc}"
                    return [("agent_error", {"message": message})], "error"
            try:
                connection = await self._connection()
            except Exception as exc:
                logger.warning("session %s: agent did not start: %s", self.session_id, exc)
                return [("agent_error", {"message": str(exc)})], "error"
        raise AssertionError("unreachable")

    async def _stream(
        self, connection: AgentConnection, text: str, blocks: list[dict[str, Any]] | None = None
    ) -> tuple[list[tuple[str, dict[str, Any]]], str]:
        """Send the prompt and store the turn's items until its end; return the last events
        (not stored yet) and the stop reason."""
        inbox = self._inbox
        assert inbox is not None
        with inbox:
            # Writing the prompt can block (a full pipe, a slow exec websocket): not here.
            await in_agent_thread(connection.prompt, text, inbox.put, blocks)
            if self._cancel_requested:  # a cancel that came while the prompt was written
                await self._send_cancel(connection)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + settings.CRAFT_TURN_TIMEOUT_SECONDS
            stored_size, over, dropped = 0, False, 0
            while True:
                try:
                    batch = await asyncio.wait_for(
                        inbox.take(BATCH_LIMIT), self._patience(deadline - loop.time())
                    )
                except TimeoutError:
                    await self._time_out(connection, deadline - loop.time() <= 0)
                    continue
                events, final = self._events_of(batch)
                if over:  # past the turn's limit: what the agent still says is counted, not kept
                    dropped += len([e for e in events if e[0] != "agent_error"])
                    events = [e for e in events if e[0] == "agent_error"]
                    self._interrupt = self._over_limit(dropped)
                if final is not None:
                    return events, final
                if not events:
                    continue
                try:
                    stored = await self._append(events)
                except (Session.DoesNotExist, Fenced):
                    raise
                except Exception as exc:
                    raise StorageFailed(exc, events) from exc
                self._watch_titles(events)
                stored_size += stored.size if stored else 0
                if stored_size > settings.CRAFT_MAX_TURN_BYTES and not over:
                    over = True
                    self._interrupt = self._over_limit(0)
                    self._cancel_requested = True
                    await self._send_cancel(connection)

    def _over_limit(self, dropped: int) -> str:
        megabytes = settings.CRAFT_MAX_TURN_BYTES / 2**20
        said = f"; {dropped} later updates were not stored" if dropped else ""
        return f"The agent's output passed {megabytes:g} MB in one turn, so Craft stopped it{said}."

    def _patience(self, left: float) -> float | None:
        """How long to wait for the agent's next item before the turn times out."""
        if self._interrupt is not None:
            return None  # cut short already: the cancel, or the stop after it, ends the turn
        if self._pending:
            return max(left, 0)  # waiting for a person's answer is not the agent hanging
        return max(min(left, settings.CRAFT_TURN_IDLE_SECONDS), 0)

    async def _time_out(self, connection: AgentConnection, too_long: bool) -> None:
        """Cut a turn short that ran too long or whose agent went silent: cancel it; the agent
        is stopped if it does not end the turn within the cancel grace."""
        if too_long:
            minutes = settings.CRAFT_TURN_TIMEOUT_SECONDS / 60
            self._interrupt = f"The turn took longer than {minutes:g} minutes, so Craft stopped it."
        else:
            seconds = settings.CRAFT_TURN_IDLE_SECONDS
            self._interrupt = (
                f"The agent sent nothing for {seconds:g} seconds, so Craft stopped it."
            )
        logger.warning("session %s: %s", self.session_id, self._interrupt)
        self._cancel_requested = True
        await self._send_cancel(connection)

    async def _drop_connection(self) -> None:
        """Stop the agent after a failure, so that no half-finished ACP turn outlives it."""
        connection, self.connection = self.connection, None
        if connection is not None:
            await in_agent_thread(connection.stop)
            await in_agent_thread(connection.wait_closed)

    def _drain_inbox(self) -> list[tuple[str, dict[str, Any]]]:
        """Take every item left in the inbox (the agent is stopped) as events."""
        events: list[tuple[str, dict[str, Any]]] = []
        while self._inbox is not None and (batch := self._inbox.take_nowait(BATCH_LIMIT)):
            events += self._events_of(batch)[0]
        return [event for event in events if event[0] != "agent_error"]

    def _store_late_updates(self) -> None:
        """Store updates that arrive outside a turn, in arrival order, after what came before."""
        if self._late is not None and not self._late.done():
            return  # the running task takes them too
        self._late = asyncio.get_running_loop().create_task(self._drain_late())

    async def _drain_late(self) -> None:
        inbox = self._inbox
        if inbox is None:
            return
        turn = self._task
        if turn is not None and not turn.done():
            # The turn's answer came before these updates on the wire, so its turn_end goes
            # into the log before them: wait for the turn to store its end.
            await asyncio.wait([turn])
        with inbox:
            while batch := inbox.take_nowait(BATCH_LIMIT):
                events = [(item.kind, item.data) for item in batch if isinstance(item, Update)]
                try:
                    await self._append(events)
                except Exception:
                    logger.exception("session %s: storing late updates failed", self.session_id)
                else:
                    self._watch_titles(events)

    def _events_of(
        self, batch: list[TurnItem]
    ) -> tuple[list[tuple[str, dict[str, Any]]], str | None]:
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
        """Store the turn's last events and its `turn_end`, retrying until storage works.

        Open permission requests are answered `cancelled` in the same append. Only a
        deleted session gives up (its log is gone with it).
        """
        answers = [
            ("permission_answer", {"request": rid, "option": None, "outcome": "cancelled"})
            for rid in self._pending
        ]
        self._pending.clear()
        # Craft's own agent_error events come last; the answers go before them.
        errors = [event for event in events if event[0] == "agent_error"]
        others = [event for event in events if event[0] != "agent_error"]
        last = [*others, *answers, *errors, ("turn_end", {"stop_reason": stop_reason})]
        delay = 0.1
        while True:
            try:
                await self._append(last)
                self._watch_titles(others)
                return
            except Session.DoesNotExist:
                logger.info("session %s was deleted during a turn", self.session_id)
                return
            except Fenced:
                await self._drop_connection()
                return
            except (DataError, IntegrityError, ValueError) as exc:
                if not others:
                    raise
                # The database refuses something in the turn's last events: the end itself
                # must get in; say what could not be kept.
                logger.error("session %s: dropping events the database refuses: %s",
                             self.session_id, exc)  # fmt: skip
                lost = ("agent_error", {"message": f"{len(others)} {LOST_EVENTS}"})
                last = [*answers, lost, *errors, ("turn_end", {"stop_reason": stop_reason})]
                others = []
            except Exception:
                # Most likely the database is unreachable for a while: keep trying.
                logger.exception(
                    "session %s: could not store the end of the turn; retrying in %.1f s",
                    self.session_id, delay,
                )  # fmt: skip
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    # --- the agent's controls (see craft.turns.controls) -----------------------------------------

    async def _control_connection(self) -> AgentConnection:
        """Return the live agent connection for a control, starting the agent if needed."""
        connection = self.connection
        if connection is not None and connection.is_running:
            return connection
        if self.running:
            raise Refused("agent_starting", "the agent is starting; try again in a moment")
        try:
            return await self._connection()
        except Session.DoesNotExist:
            raise
        except Exception as exc:
            raise Refused("agent_unavailable", f"the agent could not start: {exc}") from exc

    async def set_config_option(self, config_id: str, value: str) -> None:
        """Change one of the agent's session config options; the log records the new ones."""
        connection = await self._control_connection()
        try:
            controls.check_config_choice(connection.config_options, config_id, value)
        except controls.Invalid as invalid:
            raise Refused(invalid.code, invalid.message) from None
        try:
            options = await in_agent_thread(connection.set_config_option, config_id, value)
        except AgentError as exc:
            raise Refused("agent_refused", f"the agent refused: {exc}") from exc
        await self._append_control(controls.config_event(options))

    async def set_mode(self, mode_id: str) -> None:
        """Switch the agent to one of its modes; the log records the new mode."""
        connection = await self._control_connection()
        try:
            controls.check_mode(connection.modes, mode_id)
        except controls.Invalid as invalid:
            raise Refused(invalid.code, invalid.message) from None
        try:
            await in_agent_thread(connection.set_mode, mode_id)
        except AgentError as exc:
            raise Refused("agent_refused", f"the agent refused: {exc}") from exc
        await self._append_control(controls.mode_event(mode_id))

    async def _append_control(self, events: list[tuple[str, dict[str, Any]]]) -> None:
        """Store what a control changed; a worker that lost the session meanwhile stops."""
        try:
            await self._append(events)
        except Fenced:
            await self._drop_connection()
            raise Refused(
                "unavailable", "another server took this session over; try again"
            ) from None

    def _watch_titles(self, events: list[tuple[str, dict[str, Any]]]) -> None:
        """Let the session's title follow the agent's (after the events that named it)."""
        for title in controls.agent_titles(events):
            asyncio.get_running_loop().create_task(self._take_agent_title(title))

    async def _take_agent_title(self, title: str) -> None:
        try:
            events = await controls.follow_agent_title(self.session_id, title)
            if events:
                await self._append(events)
        except Exception:
            logger.exception("session %s: taking the agent's title failed", self.session_id)


class RunnerRegistry:
    """The runners of this process, by session id (used from the event loop only)."""

    def __init__(self) -> None:
        self._runners: dict[UUID, SessionRunner] = {}
        self.closing = False  # shutting down: no new turns

    def get(self, session_id: UUID) -> SessionRunner:
        runner = self._runners.get(session_id)
        if runner is None:
            runner = self._runners[session_id] = SessionRunner(session_id, self)
        return runner

    def is_running(self, session_id: UUID) -> bool:
        runner = self._runners.get(session_id)
        return runner is not None and runner.running

    def running(self) -> list[SessionRunner]:
        return [runner for runner in self._runners.values() if runner.running]

    def forget(self, session_id: UUID) -> None:
        self._runners.pop(session_id, None)

    def clear(self) -> None:
        self._runners.clear()
        self.closing = False


runners = RunnerRegistry()
