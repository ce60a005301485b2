"""One prompt's turn: from its stored prompt to its one `turn_end` (invariant 8).

A `Turn` owns what belongs to one turn: the permission requests it waits on, whether a cancel
was asked for, why Craft cut it short, and the task that carries it out. Its runner makes a new
one for each prompt, so nothing of a turn outlives it, and gives it a `TurnContext`: all a turn
reaches of its session. Whatever happens (the agent answers, fails, dies, hangs, floods; storage
fails; the server shuts down; another worker takes the session over), `end()` stores the turn's
last events and exactly one `turn_end`, once.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import DataError, IntegrityError

from craft.commands import Prompt
from craft.errors import Refused
from craft.models import Session
from craft.storage.eventlog import Fenced, Stored
from craft.turns import controls, records
from craft.turns.agent_calls import call_agent, send_to_agent
from craft.turns.checkpoints import SessionCheckpoints
from craft.turns.inbox import Inbox
from craft.turns.quiet import LOOK_SECONDS, QuietStatus
from craft.turns.recovery import interrupted_answer, interrupted_elicitation, interruption
from sandboxes import elicitation
from sandboxes.agent.connection import AgentConnection
from sandboxes.agent.protocol import (
    AgentError,
    AuthRequired,
    ElicitationRequest,
    PermissionRequest,
    PromptNotSent,
    RequestWithdrawn,
    TurnEnd,
    TurnFailed,
    TurnItem,
    Update,
)

logger = logging.getLogger(__name__)

Events = list[tuple[str, dict[str, Any]]]

BATCH_LIMIT = 500
STORAGE_FAILED = "Craft could not store the agent's output, so it stopped the agent."
LOST_EVENTS = "updates of the agent could not be stored and were dropped."


class StorageFailed(Exception):
    """Events of a turn could not be stored; `unsaved` holds them, in order."""

    def __init__(self, cause: BaseException, unsaved: Events) -> None:
        super().__init__(str(cause))
        self.unsaved = unsaved


# Updates that say the agent used a tool (what may change files).
TOOL_KINDS = {"tool_call", "tool_call_update"}


@dataclass(frozen=True)
class TurnContext:
    """What a turn reaches of its session, and nothing more; its runner builds it.

    The session's agent connection, its inbox and its owner change when an agent starts, so
    a turn reads them (`connection`, `inbox`, `owner_id`) each time it needs them.
    """

    session_id: UUID
    # Store events of the session under its lease (raises Fenced once it is lost).
    append: Callable[[Events], Awaitable[Stored | None]]
    connection: Callable[[], AgentConnection | None]  # the session's agent connection now
    inbox: Callable[[], Inbox | None]  # where that agent's output waits, item by item
    owner_id: Callable[[], Any]  # the session's owner, once an agent started
    # The live agent connection, or a new one (waiting for a sandbox being provisioned).
    connection_for_turn: Callable[[], Awaitable[AgentConnection]]
    drop_connection: Callable[[], Awaitable[None]]  # stop the agent after a failure
    checkpoints: SessionCheckpoints
    # The transcript block a new agent session's first prompt carries (once), or [].
    transcript_blocks: Callable[[AgentConnection], list[dict[str, Any]]]
    watch_titles: Callable[[Events], None]  # the session's title follows the agent's
    ended: Callable[[], None]  # the turn's end is stored: the session's queue moves on


class Turn:
    """Carry out one prompt (all methods run on the event loop)."""

    def __init__(self, context: TurnContext, prompt: Prompt, prompt_seq: int) -> None:
        self.context = context
        self.prompt = prompt
        self.prompt_seq = prompt_seq  # the seq of its user_message: what names the turn
        self.session_id = context.session_id
        self.used_tools = False  # a tool call or a permission request: files may have changed
        self.heard = False  # the agent sent something of the turn besides its end
        self.pending: dict[str, set[str]] = {}  # open permission requests: their option ids
        # Open elicitation requests: their form fields (None for a URL, which takes no values).
        self.elicitations: dict[str, list[dict[str, Any]] | None] = {}
        self.cancel_requested = False
        self.interrupted: str | None = None  # why Craft cut the turn short
        self.interrupted_reason: str | None = None  # the same as a code (its agent_error's)
        self.task: asyncio.Task[None] | None = None
        self.ended = False

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    def start(self) -> None:
        # A fresh context: the turn must not inherit the consumer's, which ends when the
        # browser leaves.
        self.task = asyncio.get_running_loop().create_task(
            self._run(), context=contextvars.Context()
        )

    # --- what the person (or the server) does during the turn --------------------------------

    async def cancel(self) -> None:
        """Ask for the turn to end `cancelled`: answer its open requests, tell the agent."""
        self.cancel_requested = True
        await self._answer_open_requests_cancelled()
        # If the agent has no turn yet (it is starting, or the prompt is being written), the
        # turn checks `cancel_requested` once the prompt is out: either way the agent hears.
        connection = self.context.connection()
        if connection is not None:
            await self._send_cancel(connection)

    async def interrupt(self, why: str, reason: str | None = None) -> None:
        """Cut the turn short (the server is shutting down): it ends `interrupted`, saying
        `why` (and `reason`, for clients to tell causes apart), with its open permission
        requests answered `cancelled`. The agent is asked to cancel; the caller stops it."""
        self.interrupted = why
        self.interrupted_reason = reason
        self.cancel_requested = True
        connection = self.context.connection()
        if connection is not None:
            await send_to_agent(connection, connection.cancel)

    async def answer_permission(self, request_id: str, option_id: str) -> None:
        """Answer the agent's permission request with one of its options."""
        options = self.pending.get(request_id)
        connection = self.context.connection()
        if options is None or connection is None:
            raise Refused("unknown_request", "that permission request is not open")
        if option_id not in options:
            raise Refused("invalid_option", f"{option_id!r} is not an option of that request")
        del self.pending[request_id]
        # Stored before the agent hears it, so the log never shows the agent acting on an
        # answer that comes later in the log.
        await self.context.append(
            [("permission_answer", {"request": request_id, "option": option_id})]
        )
        await send_to_agent(connection, connection.answer_permission, request_id, option_id)

    async def answer_elicitation(
        self, request_id: str, action: str, content: dict[str, Any] | None
    ) -> None:
        """Answer the agent's elicitation request: `accept` (a form's values, checked against
        its fields), `decline` or `cancel`."""
        connection = self.context.connection()
        if request_id not in self.elicitations or connection is None:
            raise Refused("unknown_request", "that request for information is not open")
        fields = self.elicitations[request_id]
        checked: dict[str, Any] | None = None
        if action == "accept" and fields is not None:
            try:
                checked = elicitation.check_content(fields, content if content is not None else {})
            except ValueError as exc:
                raise Refused("invalid_content", str(exc)) from None
        del self.elicitations[request_id]
        data: dict[str, Any] = {"request": request_id, "action": action}
        if checked is not None:
            data["content"] = checked
        # Stored before the agent hears it, like a permission answer.
        await self.context.append([("elicitation_answer", data)])
        await send_to_agent(connection, connection.answer_elicitation, request_id, action, checked)

    async def _answer_open_requests_cancelled(self) -> None:
        answered = list(self.pending)
        self.pending.clear()
        events: Events = [
            ("permission_answer", {"request": rid, "option": None, "outcome": "cancelled"})
            for rid in answered
        ]
        events += self._elicitations_closed("turn_cancelled")
        if events:
            await self.context.append(events)

    def _elicitations_closed(self, reason: str) -> Events:
        """Return the answers of the open elicitation requests, closed as cancelled."""
        closed = list(self.elicitations)
        self.elicitations.clear()
        if reason == "interrupted":
            return [interrupted_elicitation(rid) for rid in closed]
        return [
            ("elicitation_answer", {"request": rid, "action": "cancel", "reason": reason})
            for rid in closed
        ]

    async def _send_cancel(self, connection: AgentConnection) -> None:
        await send_to_agent(connection, connection.cancel)
        asyncio.get_running_loop().create_task(
            self._stop_if_still_running(connection), context=contextvars.Context()
        )

    async def _stop_if_still_running(self, connection: AgentConnection) -> None:
        """Stop an agent that ignores `session/cancel`, so that cancel always ends the turn.

        Its connection dies with it; the next prompt starts a new agent.
        """
        if self.task is None:
            return
        grace = settings.CRAFT_CANCEL_GRACE_SECONDS
        try:
            await asyncio.wait_for(asyncio.shield(self.task), timeout=grace)
        except TimeoutError:
            logger.warning(
                "session %s: agent ignored cancel for %s s; stopping it", self.session_id, grace
            )
            await call_agent(connection.stop)

    # --- carrying it out ------------------------------------------------------------------------

    async def _run(self) -> None:
        """Run the turn to its end; whatever happens, the log gets exactly one turn_end."""
        context = self.context
        ending: Events = []
        try:
            try:
                connection = await context.connection_for_turn()
            except Exception as exc:
                logger.warning("session %s: agent did not start: %s", self.session_id, exc)
                ending, reason = [("agent_error", start_failure(exc))], "error"
            else:
                # The previous turn's checkpoint must be written before this one changes
                # anything (it usually is: checkpoints follow only turns that used tools).
                await context.checkpoints.before_turn(self.prompt_seq)
                if self.cancel_requested:
                    ending, reason = [], "cancelled"
                else:
                    ending, reason = await self._send(connection)
                    if reason in ("cancelled", "error") and not self.cancel_requested:
                        ending = await self._unless_sandbox_stopped(ending)
        except Fenced:
            # Another worker took the session over; it closed this turn. Nothing more here.
            self.ended = True
            await context.drop_connection()
            return
        except StorageFailed as failure:
            logger.exception("session %s: storing the turn failed", self.session_id)
            await context.drop_connection()
            # Keep what the agent said before it was stopped: it goes in with the end.
            drained = [event for event in self._drain_inbox() if event[0] != "agent_error"]
            ending = [*failure.unsaved, *drained, ("agent_error", {"message": STORAGE_FAILED})]
            reason = "interrupted"
        except Exception as exc:
            logger.exception("session %s: turn failed", self.session_id)
            await context.drop_connection()
            ending, reason = [("agent_error", {"message": f"internal error: {exc}"})], "error"
        if self.interrupted is not None:
            ending = [*ending, interruption(self.interrupted, self.interrupted_reason)]
            reason = "interrupted"
        await self.end(ending, reason)
        if self.used_tools:
            context.checkpoints.after_turn(self.prompt_seq)
        context.ended()

    def _drain_inbox(self) -> Events:
        """Take every item left in the inbox (the agent is stopped) as events."""
        events: Events = []
        inbox = self.context.inbox()
        while inbox is not None and (batch := inbox.take_nowait(BATCH_LIMIT)):
            events += [(item.kind, item.data) for item in batch if isinstance(item, Update)]
        return events

    async def _unless_sandbox_stopped(self, ending: Events) -> Events:
        """An agent that ended the turn on its own with an error or `cancelled` may have been
        stopped with its sandbox (by an administrator, or its owner through the API): then
        the turn is interrupted, and says so instead of what the dying agent said."""
        stopped = await records.sandbox_stopped(self.session_id)
        if stopped is None:
            return ending
        self.interrupted, self.interrupted_reason = stopped
        return [event for event in ending if event[0] != "agent_error"]

    async def _send(self, connection: AgentConnection) -> tuple[Events, str]:
        """Stream the turn. A new agent takes the prompt, once, if the agent never got it
        (writing it failed: the agent died just before), or if the agent went with its
        sandbox before it said a word of the turn (`_lost_before_a_word`)."""
        attachments = list(self.prompt.attachments)
        for attempt in (1, 2):
            try:
                controls.check_capabilities(attachments, connection.prompt_capabilities)
            except Refused as refused:
                return [("agent_error", {"message": refused.message})], "error"
            blocks = controls.prompt_blocks(attachments, connection.cwd)
            blocks += self.context.transcript_blocks(connection)
            try:
                ending, reason = await self._stream(connection, blocks)
            except PromptNotSent as exc:
                logger.info("session %s: prompt not sent (%s)", self.session_id, exc)
                await self.context.drop_connection()
                if attempt == 2 or self.cancel_requested:
                    message = f"the agent could not take the prompt: {exc}"
                    return [("agent_error", {"message": message})], "error"
            else:
                if attempt == 2 or not await self._lost_before_a_word(connection, reason):
                    return ending, reason
                logger.info(
                    "session %s: its agent went with its sandbox before it answered; the "
                    "prompt goes to a new agent there", self.session_id,
                )  # fmt: skip
                await self.context.drop_connection()
            try:
                connection = await self.context.connection_for_turn()
            except Exception as exc:
                logger.warning("session %s: agent did not start: %s", self.session_id, exc)
                return [("agent_error", start_failure(exc))], "error"
        raise AssertionError("unreachable")

    async def _lost_before_a_word(self, connection: AgentConnection, reason: str) -> bool:
        """Say whether the turn failed because its agent went with its sandbox (its pod
        deleted, its folder removed) before the agent sent anything of the turn. A prompt
        written as its pod was being deleted reaches a process that is about to die: the
        sandbox, set up again on its files, takes it instead. An agent that sent a word may
        have done something: that turn ends with the error, as any other."""
        if reason != "error" or self.heard or connection.is_running:
            return False
        if self.cancel_requested or self.interrupted is not None:
            return False
        return await records.lost_with_its_sandbox(self.session_id)

    async def _stream(
        self, connection: AgentConnection, blocks: list[dict[str, Any]]
    ) -> tuple[Events, str]:
        """Send the prompt and store the turn's items until its end; return the last events
        (not stored yet) and the stop reason."""
        inbox = self.context.inbox()
        assert inbox is not None
        with inbox:
            # Writing the prompt can block a pod exec's websocket (then not here); a local
            # agent's full pipe keeps what it cannot take.
            await send_to_agent(connection, connection.prompt, self.prompt.text, inbox.put, blocks)
            if self.cancel_requested:  # a cancel that came while the prompt was written
                await self._send_cancel(connection)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + settings.CRAFT_TURN_TIMEOUT_SECONDS
            quiet = QuietStatus(self.session_id, self.context.owner_id(), connection)
            try:
                return await self._take_all(connection, inbox, deadline, quiet)
            finally:
                quiet.end()

    async def _take_all(
        self, connection: AgentConnection, inbox: Inbox, deadline: float, quiet: QuietStatus
    ) -> tuple[Events, str]:
        """Store the turn's items as they come until its end (see `_stream`); while the agent
        is quiet, its owner is shown what it last wrote to stderr (`quiet`)."""
        loop = asyncio.get_running_loop()
        stored_size, over, dropped = 0, False, 0
        heard_at = loop.time()  # when the agent last sent something
        while True:
            now = loop.time()
            if self.pending or self.elicitations:
                heard_at = now  # waiting for a person's answer is not the agent's silence
            patience = self._patience(deadline - now, now - heard_at)
            look_in = self._look_in(now - heard_at)
            looking = look_in is not None and (patience is None or look_in < patience)
            try:
                batch = await inbox.take(BATCH_LIMIT, look_in if looking else patience)
            except TimeoutError:
                if looking:
                    quiet.look(loop.time())
                else:
                    await self._time_out(connection, deadline - loop.time() <= 0)
                continue
            heard_at = loop.time()
            quiet.heard()
            self.heard = self.heard or any(not isinstance(i, TurnEnd | TurnFailed) for i in batch)
            events, final = self.events_of(batch)
            if over:  # past the turn's limit: what the agent still says is counted, not kept
                dropped += len([e for e in events if e[0] != "agent_error"])
                events = [e for e in events if e[0] == "agent_error"]
                self.interrupted = self._over_limit(dropped)
            if final is not None:
                return events, final
            if not events:
                continue
            try:
                stored = await self.context.append(events)
            except (Session.DoesNotExist, Fenced):
                raise
            except Exception as exc:
                raise StorageFailed(exc, events) from exc
            self.context.watch_titles(events)
            stored_size += stored.size if stored else 0
            if stored_size > settings.CRAFT_MAX_TURN_BYTES and not over:
                over = True
                self.interrupted = self._over_limit(0)
                self.cancel_requested = True
                await self._send_cancel(connection)

    def _over_limit(self, dropped: int) -> str:
        megabytes = settings.CRAFT_MAX_TURN_BYTES / 2**20
        said = f"; {dropped} later updates were not stored" if dropped else ""
        return f"The agent's output passed {megabytes:g} MB in one turn, so Craft stopped it{said}."

    def _patience(self, left: float, silent: float) -> float | None:
        """How long to wait for the agent's next item before the turn times out, `left` before
        its deadline, the agent silent for `silent` seconds."""
        if self.interrupted is not None:
            return None  # cut short already: the cancel, or the stop after it, ends the turn
        if self.pending or self.elicitations:
            return max(left, 0)  # waiting for a person's answer is not the agent hanging
        return max(min(left, settings.CRAFT_TURN_IDLE_SECONDS - silent), 0)

    def _look_in(self, silent: float) -> float | None:
        """Return how long until the quiet turn's stderr is looked at again, the agent silent
        for `silent` seconds (None: not while a person is asked something)."""
        if self.pending or self.elicitations:
            return None
        return max(settings.CRAFT_AGENT_QUIET_SECONDS - silent, 0) or LOOK_SECONDS

    async def _time_out(self, connection: AgentConnection, too_long: bool) -> None:
        """Cut a turn short that ran too long or whose agent went silent: cancel it; the agent
        is stopped if it does not end the turn within the cancel grace."""
        if too_long:
            minutes = settings.CRAFT_TURN_TIMEOUT_SECONDS / 60
            self.interrupted = (
                f"The turn took longer than {minutes:g} minutes, so Craft stopped it."
            )
        else:
            seconds = settings.CRAFT_TURN_IDLE_SECONDS
            self.interrupted = (
                f"The agent sent nothing for {seconds:g} seconds, so Craft stopped it."
            )
        logger.warning("session %s: %s", self.session_id, self.interrupted)
        self.cancel_requested = True
        await self._send_cancel(connection)

    def events_of(self, batch: list[TurnItem]) -> tuple[Events, str | None]:
        """Turn items into events, noting the permission requests it now waits on; return them
        and the stop reason if the turn ended."""
        events: Events = []
        final: str | None = None
        for item in batch:
            if isinstance(item, Update):
                events.append((item.kind, item.data))
                if item.kind in TOOL_KINDS:
                    self.used_tools = True
            elif isinstance(item, PermissionRequest):
                self.used_tools = True
                self.pending[item.request_id] = {str(o.get("optionId")) for o in item.options}
                data = {"request": item.request_id, "toolCall": item.tool_call,
                        "options": item.options}  # fmt: skip
                events.append(("permission_request", data))
            elif isinstance(item, ElicitationRequest):
                events.append(("elicitation_request", elicitation_event(item)))
                if not item.refused:
                    fields = item.fields if item.mode == "form" else None
                    self.elicitations[item.request_id] = fields
            elif isinstance(item, RequestWithdrawn):
                events += self._withdrawn(item)
            elif isinstance(item, TurnEnd):
                final = item.stop_reason
            elif isinstance(item, TurnFailed):
                events.append(("agent_error", {"message": item.message, **item.details}))
                final = "error"
        return events, final

    def _withdrawn(self, item: RequestWithdrawn) -> Events:
        """Return the answer that closes a request the agent withdrew (`$/cancel_request`)."""
        request = item.request_id
        if item.kind == "elicitation" and request in self.elicitations:
            del self.elicitations[request]
            data = {"request": request, "action": "cancel", "reason": "withdrawn"}
            return [("elicitation_answer", data)]
        if item.kind == "permission" and self.pending.pop(request, None) is not None:
            answer = {"request": request, "option": None, "outcome": "cancelled"}
            return [("permission_answer", {**answer, "reason": "withdrawn"})]
        return []  # answered meanwhile: the person's answer is in the log

    async def end(self, events: Events, stop_reason: str) -> None:
        """Store the turn's last events and its `turn_end`, once, retrying until storage works.

        Open permission requests are answered `cancelled` in the same append. Only a deleted
        session (its log is gone with it) or a lost lease (the new owner closes the turn)
        gives up.
        """
        if self.ended:
            return
        self.ended = True
        if stop_reason == "interrupted":  # a person did not cancel them: Craft did
            answers = [interrupted_answer(rid) for rid in self.pending]
            answers += self._elicitations_closed("interrupted")
        else:
            answers = [
                ("permission_answer", {"request": rid, "option": None, "outcome": "cancelled"})
                for rid in self.pending
            ]
            answers += self._elicitations_closed("turn_ended")
        self.pending.clear()
        # Craft's own agent_error events come last; the answers go before them.
        errors = [event for event in events if event[0] == "agent_error"]
        others = [event for event in events if event[0] != "agent_error"]
        last = [*others, *answers, *errors, ("turn_end", {"stop_reason": stop_reason})]
        delay = 0.1
        while True:
            try:
                await self.context.append(last)
                self.context.watch_titles(others)
                return
            except Session.DoesNotExist:
                logger.info("session %s was deleted during a turn", self.session_id)
                return
            except Fenced:
                await self.context.drop_connection()
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


def start_failure(exc: Exception) -> dict[str, Any]:
    """Return the `agent_error` of an agent that did not start: for one that wants
    authentication, with `reason` `auth_required` and the agent's `authMethods`; with what
    the agent wrote to stderr, when it did (`AgentError.details`)."""
    details = exc.details if isinstance(exc, AgentError) else {}
    if isinstance(exc, AuthRequired):
        return {"message": str(exc), "reason": "auth_required", "authMethods": exc.methods,
                **details}  # fmt: skip
    return {"message": str(exc), **details}


def start_said(exc: Exception) -> str:
    """Return why an agent did not start, as a person reads it: the line of its stderr that
    says what went wrong when it wrote one, else the error's message."""
    if isinstance(exc, AuthRequired) or not isinstance(exc, AgentError):
        return str(exc)  # a sign-in's own words name the key to check
    line = exc.details.get("stderr_line")
    return line if isinstance(line, str) and line else str(exc)


def elicitation_event(request: ElicitationRequest) -> dict[str, Any]:
    """Return the stored `elicitation_request` of an agent's `elicitation/create`."""
    data: dict[str, Any] = {"request": request.request_id, "mode": request.mode,
                            "message": request.message}  # fmt: skip
    if request.mode == "form" and not request.refused:
        data["fields"] = request.fields
        data["answerable"] = elicitation.answerable(request.fields)
    if request.url:
        data["url"] = request.url
    if request.elicitation_id:
        data["elicitationId"] = request.elicitation_id
    if request.tool_call_id:
        data["toolCallId"] = request.tool_call_id
    if request.refused:
        data["refused"] = request.refused
    return data
