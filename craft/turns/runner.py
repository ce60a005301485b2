"""Session runners: one per live session in this process, owning its agent and its turns.

A runner carries out the commands of its session that reach this worker (`handle`, once per
command): a prompt is stored and its `Turn` run as a background task on the event loop, never
inside a consumer's `receive`, so a browser that leaves does not stop the turn and `cancel` is
always heard. Every item of a turn is stored in wire order through the event log's writer,
which batches whatever has piled up into one transaction and hands the frames to live sockets
after commit.

Where the work runs: the agent's reader thread parses its output and drops items into the
runner's `Inbox`, waking the event loop once per batch rather than once per item. Starting an
agent (spawn, `initialize`, `session/new`: up to tens of seconds on Kubernetes) and every write
to an agent run on `agent_calls`, never on the database threads, so a slow agent never delays
another session's storage. A follow-up prompt reuses the runner's live connection without
touching the database or the connection cache.

One turn at a time per session: a prompt that arrives while a turn runs, or while the
sandbox starts, waits in the session's queue (the runner's `SessionQueue`, over the rows of
`craft.turns.queue`) and runs when the turn ends or the sandbox is ready; a client that asks
not to queue (`"queue": false`) is refused with `turn_running` or `sandbox_starting` instead.
A turn reaches its session only through the `TurnContext` its runner builds.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import IntegrityError

from craft import credentials
from craft.commands import (
    AnswerElicitation,
    AnswerPermission,
    Cancel,
    CommitRepository,
    EditQueued,
    Fork,
    OpenPullRequest,
    PrepareRepository,
    Prompt,
    PushRepository,
    RefreshPullRequest,
    RemoveQueued,
    Revert,
    Rewind,
    RunQueue,
    SendNow,
    SessionCommand,
    SetConfigOption,
    SetMode,
    StartAgent,
    UpdateRepository,
)
from craft.errors import DiskFull, Refused
from craft.models import Session
from craft.storage.db import db_calls, db_sync_to_async
from craft.storage.eventlog import Fence, Fenced, Stored, writer
from craft.storage.titles import set_session_title
from craft.turns import controls, going_back, queue, records
from craft.turns.agent_calls import call_agent
from craft.turns.checkpoints import SessionCheckpoints
from craft.turns.inbox import Inbox
from craft.turns.recovery import close_turns_of_gone_workers
from craft.turns.repository import SessionRepositoryWork
from craft.turns.session_queue import SessionQueue
from craft.turns.turn import BATCH_LIMIT, Events, Turn, TurnContext, start_said
from sandboxes import services as sandbox_services
from sandboxes.agent.connection import AgentConnection
from sandboxes.agent.protocol import TURN_UPDATES, AgentError, Update
from sandboxes.backends import SandboxError
from sandboxes.models import Sandbox

logger = logging.getLogger(__name__)

# A sandbox's activity time is written at most this often (it feeds idle reaping, not the UI).
ACTIVITY_EVERY = 60.0
TURN_RUNNING = "the agent is still working on the previous prompt"
SANDBOX_STARTING = "your sandbox is still starting: send it when it is ready"
REPOSITORY_PREPARING = "the session's repository is still being cloned: send it when it is ready"


class SessionRunner:
    """Run one session's turns; all methods are called on the event loop."""

    def __init__(self, session_id: UUID, closing: Callable[[], bool]) -> None:
        self.session_id = session_id
        self._closing = closing  # whether the server shuts down (its registry knows)
        self.connection: AgentConnection | None = None
        self.inbox: Inbox | None = None
        self.turn: Turn | None = None  # the last one
        # (worker, token) of the lease under which this worker runs the session; set by the
        # registry before each command it hands here (see craft.cluster.forwarding).
        self.fence: Fence | None = None
        self._sandbox_id: UUID | None = None
        self.owner_id: Any = None  # the session's owner (their sandbox's), once an agent started
        self._lock = asyncio.Lock()
        self._late: asyncio.Task[None] | None = None  # storing updates that came after a turn
        self._titled = False
        self._active_at = 0.0
        self._touching: asyncio.Task[None] | None = None  # the sandbox's activity being written
        self.checkpoints = SessionCheckpoints(session_id, self.append)
        self.repository = SessionRepositoryWork(
            session_id, self.append, self.checkpoints.take_first
        )
        self._starting = asyncio.Lock()  # one agent start at a time (a turn, a control)
        # What the last agent of this runner takes in prompts (None: not known yet).
        self._prompt_capabilities: dict[str, bool] | None = None
        self.queue = SessionQueue(session_id, self, self._lock)
        self._handling = 0  # commands being carried out here right now
        # The transcript the next prompt carries to a new agent session (`transcript_blocks`).
        self._transcript: str | None = None
        # Updates of a turn that came after its end, and were dropped (`_drain_late`).
        self.late_updates_dropped = 0

    @property
    def running(self) -> bool:
        return self.turn is not None and self.turn.running

    @property
    def closing(self) -> bool:
        """Whether the server is shutting down: no new turns."""
        return self._closing()

    def agent_running(self) -> bool:
        """Whether the session's agent runs here now."""
        return self.connection is not None and self.connection.is_running

    @property
    def busy(self) -> bool:
        """Whether a command is being handled or an agent started here right now (a prompt
        being stored has no turn yet, and may have no agent yet; a command reads the database
        before it takes any lock), or queued prompts wait here for the sandbox: the session's
        lease is kept for them meanwhile."""
        if self.running or self._handling or self._lock.locked() or self._starting.locked():
            return True
        if self.repository.preparing:
            return True
        return self.queue.waiting_for_sandbox

    @property
    def task(self) -> asyncio.Task[None] | None:
        return self.turn.task if self.turn is not None else None

    async def handle(self, command: SessionCommand) -> None:
        """Carry out one command of the session; raise Refused with what the client is told."""
        self._handling += 1
        try:
            await self._carry_out(command)
        finally:
            self._handling -= 1

    async def _carry_out(self, command: SessionCommand) -> None:
        await CARRIED_OUT_BY[type(command)](self, command)

    def take_fence(self, fence: Fence) -> None:
        """Run the next command under this lease. A new lease means another worker may have
        owned the session meanwhile: what this runner knew of it is forgotten (`released`)."""
        if fence != self.fence:
            self.released()
        self.fence = fence

    def released(self) -> None:
        """Forget what this runner knew of the session's queue and latest checkpoint: another
        worker may change them before this one runs the session again (after a takeover, or
        after this worker gave the lease up: its next lease can carry the same token)."""
        self.queue.forget()
        self.checkpoints.forget()

    async def append(self, events: Events, *, client_id: str | None = None) -> Stored | None:
        """Store events of this session under this worker's lease (see craft.cluster)."""
        return await writer.append(self.session_id, events, client_id=client_id, fence=self.fence)

    async def lose(self) -> None:
        """This worker lost the session's lease: stop its agent; store nothing more (the
        fence it holds is refused by the event log from now on)."""
        logger.warning("session %s: lease lost; stopping its agent here", self.session_id)
        self.released()  # the new owner changes the queue and takes checkpoints from now on
        await self.drop_connection()
        await self.checkpoints.close()
        await self.repository.close()

    # --- turns ----------------------------------------------------------------------------

    async def prompt(self, prompt: Prompt) -> bool:
        """Store the prompt and start its turn, or queue it while the session is busy; return
        False for a repeated client id.

        Its attachments go to the agent after the text; the log keeps what they were, not
        an image's bytes.
        """
        attachments = list(prompt.attachments)
        if attachments and self._prompt_capabilities is not None:
            controls.check_capabilities(attachments, self._prompt_capabilities)
        async with self._lock:
            if self.closing:
                raise Refused("shutting_down", "the server is restarting; send it again soon")
            starting = False
            if self.connection is None or not self.connection.is_running:
                # An agent that would not start for want of its owner's keys: nothing is
                # stored, and the client keeps the prompt (docs/agents.md). Else a session
                # whose sandbox was terminated moves to a new one here.
                try:
                    status, moved, cloning = await records.sandbox_for_prompt(
                        self.session_id, keys=True
                    )
                except credentials.CredentialsMissing as missing:
                    raise Refused("credentials_missing", str(missing)) from None
                except DiskFull as over:
                    raise Refused("disk_full", str(over)) from None
                starting = status == Sandbox.Status.PROVISIONING
                if not prompt.queue and starting and not moved:
                    # Nothing is stored: the client sends it again when the sandbox is ready.
                    raise Refused("sandbox_starting", SANDBOX_STARTING)
                if cloning:
                    # The first prompt waits, queued, for the session's repository.
                    if not prompt.queue:
                        raise Refused("repository_not_ready", REPOSITORY_PREPARING)
                    return await self.queue.add_for_repository(prompt)
            elif (full := sandbox_services.disk_refusal(self._sandbox_id)) is not None:
                # Its agent runs: the sandbox it runs in is the session's (checked in memory).
                raise Refused("disk_full", full)
            if not prompt.queue:
                starting = False  # a moved session's turn waits for its new sandbox
                if self.running:
                    if await records.prompt_seen(self.session_id, prompt.id):
                        return False  # a resend of the prompt that started this turn
                    raise Refused("turn_running", TURN_RUNNING)
            if starting or self.running or await self.queue.length():
                return await self.queue.add(prompt, starting)
            await self.settle()
            # A first turn's checkpoint is confirmed beside storing its prompt.
            self.checkpoints.confirm_first()
            stored: Stored | None = None
            try:
                stored = await self._store_prompt(prompt)
            finally:
                if stored is None:
                    self.checkpoints.confirmation_unused()
            if stored is None:
                return False
            self.start_turn(prompt, stored.first_seq)
        await self.take_title(prompt)
        return True

    async def settle(self) -> None:
        """Wait for what must be stored before a turn starts: updates that came after the
        last turn, and its checkpoint."""
        if self._late is not None:
            await asyncio.gather(self._late, return_exceptions=True)
        await self.checkpoints.settle()

    def start_turn(self, prompt: Prompt, prompt_seq: int) -> None:
        """Start the turn of a stored prompt (under the runner's lock)."""
        self.turn = Turn(self._turn_context(), prompt, prompt_seq)
        self.turn.start()

    def _turn_context(self) -> TurnContext:
        """Return what a turn reaches of this session (see `TurnContext`)."""
        return TurnContext(
            session_id=self.session_id,
            append=self.append,
            connection=lambda: self.connection,
            inbox=lambda: self.inbox,
            owner_id=lambda: self.owner_id,
            connection_for_turn=self.connection_for_turn,
            drop_connection=self.drop_connection,
            checkpoints=self.checkpoints,
            transcript_blocks=self.transcript_blocks,
            watch_titles=self.watch_titles,
            ended=self.queue.moves_on,
        )

    async def take_title(self, prompt: Prompt) -> None:
        if not self._titled:
            self._titled = True
            await db_calls.run(
                partial(set_session_title, self.session_id, prompt.text, "prompt", fence=self.fence)
            )

    def prepare_repository(self) -> None:
        """Make the session's repository's clone in the background if it is not made; its
        queue runs once it is ready (or failed: the session goes on without it)."""
        if not self.closing:
            self.repository.prepare(self.queue.moves_on)

    async def _ship(self, work: Any) -> None:
        """Carry out repository work (commit, push, ...), which changes nothing while a turn
        runs: refused then (`turn_running`)."""
        async with self._lock:
            if self.running:
                work.close()
                raise Refused("turn_running", "the agent is working: try again once its turn ends")
            await work

    async def _store_prompt(self, prompt: Prompt) -> Stored | None:
        """Store the user_message, which starts the session's durable turn.

        The database refuses a second running turn (another worker's, or one whose worker
        is gone and not yet closed: that one is closed here and the prompt stored after it).
        """
        event = [("user_message", queue.prompt_data(prompt))]
        try:
            return await self.append(event, client_id=prompt.id)
        except IntegrityError:
            if not await db_sync_to_async(close_turns_of_gone_workers)(self.session_id):
                raise Refused("turn_running", TURN_RUNNING) from None
        try:
            return await self.append(event, client_id=prompt.id)
        except IntegrityError:
            raise Refused("turn_running", TURN_RUNNING) from None

    async def cancel(self) -> None:
        """Cancel the running turn; it ends with stop reason `cancelled`."""
        if self.turn is None or not self.turn.running:
            raise Refused("not_running", "no turn is running")
        await self.turn.cancel()

    async def interrupt(self, why: str, reason: str | None = None) -> None:
        """Cut the running turn short (the server is shutting down); see `Turn.interrupt`."""
        if self.turn is not None and self.turn.running:
            await self.turn.interrupt(why, reason)

    async def answer_permission(self, request_id: str, option_id: str) -> None:
        """Answer the running turn's permission request with one of its options."""
        if self.turn is None:
            raise Refused("unknown_request", "that permission request is not open")
        await self.turn.answer_permission(request_id, option_id)

    async def answer_elicitation(
        self, request_id: str, action: str, content: dict[str, Any] | None
    ) -> None:
        """Answer the running turn's elicitation request (accept, decline or cancel)."""
        if self.turn is None:
            raise Refused("unknown_request", "that request for information is not open")
        await self.turn.answer_elicitation(request_id, action, content)

    async def revert(self, seq: int, path: str, hunk: int | None) -> None:
        """Put the workspace back as it was before change `seq` (see `SessionCheckpoints`);
        refused while a turn runs, which would change the files meanwhile."""
        async with self._lock:
            if self.running:
                raise Refused("turn_running", "the agent is working: revert once its turn ends")
            await self.checkpoints.revert(seq, path, hunk, fence=self.fence)

    async def fork(self, seq: int, new_id: UUID, before: bool = False) -> None:
        """Make session `new_id` as this one was just after turn `seq`, or just `before` it
        (craft.turns.going_back); refused while a turn runs. The latest checkpoint is written
        first."""
        async with self._lock:
            if self.running:
                raise Refused("turn_running", "the agent is working: fork once its turn ends")
            await self.checkpoints.settle()
            await going_back.fork(self.session_id, seq, new_id, before)

    async def rewind(self, seq: int) -> None:
        """Take the session back to just after turn `seq` (craft.turns.going_back): its files,
        and its agent, which is stopped here; the next starts a new agent session given the
        transcript of the turns kept. Refused while a turn runs."""
        async with self._lock:
            if self.running:
                raise Refused("turn_running", "the agent is working: rewind once its turn ends")
            await self.checkpoints.settle()
            try:
                await going_back.rewind(self.session_id, seq, self.fence)
            finally:
                self.checkpoints.forget()  # whatever happened, the store says the latest
            await self.drop_connection()
            self._transcript = None

    def transcript_blocks(self, connection: AgentConnection) -> list[dict[str, Any]]:
        """Return (once) the transcript block the next prompt carries to a new agent session
        after a fork or a rewind; [] if none is due."""
        text, self._transcript = self._transcript, None
        if not text:
            return []
        embedded = connection.prompt_capabilities.get("embeddedContext", False)
        return [going_back.transcript_block(text, embedded)]

    # --- the agent connection ---------------------------------------------------------------

    async def connection_for_turn(self, *, wait_for_sandbox: bool = True) -> AgentConnection:
        """Return the session's live agent connection: this runner's, or a new one.

        A turn waits for a sandbox that is being provisioned (its prompt was accepted: the
        session moved to a new sandbox, see `records.sandbox_for_prompt`); a control does not.
        The sandbox's activity is written at most every ACTIVITY_EVERY seconds, in the
        background.
        """
        cached = self.connection
        if cached is not None and cached.is_running:
            if time.monotonic() - self._active_at > ACTIVITY_EVERY and self._sandbox_id:
                self._active_at = time.monotonic()
                # Beside the turn, not ahead of it: the agent hears the prompt without waiting
                # for this write (400 sessions prompted at once queued 400 of them on the
                # database threads before their agents heard a word).
                if self._touching is None or self._touching.done():
                    self._touching = asyncio.get_running_loop().create_task(
                        self._touch(self._sandbox_id), context=contextvars.Context()
                    )
            return cached
        self.connection = None
        async with self._starting:
            if self.connection is not None and self.connection.is_running:
                return self.connection  # started meanwhile, for a control or a turn
            return await self._start_connection(wait_for_sandbox)

    async def _touch(self, sandbox_id: UUID) -> None:
        """Record that the sandbox is in use (its idle time, which reaping reads, restarts)."""
        try:
            await db_sync_to_async(sandbox_services.touch_sandbox)(sandbox_id)
        except Exception:
            logger.warning(
                "session %s: recording its sandbox's activity failed", self.session_id,
                exc_info=True,
            )  # fmt: skip

    async def _start_to_make(self, wait: bool) -> records.Start:
        """Return what the session's agent starts with (its running sandbox, the agent
        session to reattach to, its launch); with `wait`, wait for a sandbox being
        provisioned, at most CRAFT_SANDBOX_PROVISIONING_TIMEOUT (then, or when it failed,
        SandboxUnavailable says why)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + settings.CRAFT_SANDBOX_PROVISIONING_TIMEOUT
        pause = 0.05
        while True:
            start = await records.start_of(self.session_id, wait=wait and loop.time() < deadline)
            if start is not None:
                return start
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)

    async def _start_connection(self, wait_for_sandbox: bool = False) -> AgentConnection:
        """Start the session's agent, reattached to its earlier agent session if any.

        Database work on the database threads, the agent's start on an agent thread: a start
        that takes seconds holds no database connection. The start's events (one
        `agent_restarted` if an earlier agent process was replaced, and `agent_info`) are
        queued before anything the agent sends outside a turn.
        """
        # The session's own agent, with its owner's credentials (CredentialsMissing says
        # which are missing); they go to the agent's environment and nowhere else.
        sandbox, reattach, launch = await self._start_to_make(wait_for_sandbox)
        try:
            connection = await call_agent(
                sandbox_services.agent_connection, sandbox, self.session_id, reattach or None,
                launch,
            )  # fmt: skip
        except sandbox_services.SandboxUnavailable:
            # Its folder or pod was found gone just now: a turn waits for it to be set up
            # again, on its files (its volume's, on Kubernetes), and starts the agent there.
            if not wait_for_sandbox or not await records.bring_back(self.session_id):
                raise
            sandbox, reattach, launch = await self._start_to_make(wait_for_sandbox)
            connection = await call_agent(
                sandbox_services.agent_connection, sandbox, self.session_id, reattach or None,
                launch,
            )  # fmt: skip
        self._sandbox_id = sandbox.pk
        self.owner_id = sandbox.owner_id
        await records.record_start(self.session_id, sandbox.pk, connection.agent_session_id)
        self._active_at = time.monotonic()
        self._prompt_capabilities = connection.prompt_capabilities
        # A new agent session after a fork or a rewind: its first prompt gives it the
        # conversation so far (read only when an agent starts without one to reattach to).
        self._transcript = (
            None
            if reattach
            else await db_sync_to_async(going_back.pending_transcript)(self.session_id)
        )
        if not controls.announced(connection):
            await self.append(controls.start_events(connection))
            controls.announce(connection)  # not before: events refused are sent again
        inbox = Inbox(asyncio.get_running_loop(), self._store_late_updates)
        connection.idle_sink = inbox.put
        self.inbox = inbox
        self.connection = connection
        return connection

    async def drop_connection(self) -> None:
        """Stop the agent after a failure, so that no half-finished ACP turn outlives it."""
        connection, self.connection = self.connection, None
        if connection is not None:
            await call_agent(connection.stop)
            await call_agent(connection.wait_closed)

    def _store_late_updates(self) -> None:
        """Store updates that arrive outside a turn, in arrival order, after what came before;
        those of a turn that has ended are dropped and counted (see `_drain_late`)."""
        if self._late is not None and not self._late.done():
            return  # the running task takes them too
        self._late = asyncio.get_running_loop().create_task(self._drain_late())

    async def _drain_late(self) -> None:
        inbox = self.inbox
        if inbox is None:
            return
        task = self.task
        if task is not None and not task.done():
            # The turn's answer came before these updates on the wire, so its turn_end goes
            # into the log before them: wait for the turn to store its end.
            await asyncio.wait([task])
        with inbox:
            while batch := inbox.take_nowait(BATCH_LIMIT):
                events = [(item.kind, item.data) for item in batch if isinstance(item, Update)]
                if self.turn is not None:
                    events = self._without_turn_updates(events)
                try:
                    await self.append(events)
                except Exception:
                    logger.exception("session %s: storing late updates failed", self.session_id)
                else:
                    self.watch_titles(events)

    def _without_turn_updates(self, events: Events) -> Events:
        """Return `events` without updates of a turn (TURN_UPDATES), counted and logged: no
        event of a turn is stored after its `turn_end`. The connection drops those that
        come after a turn's answer on the wire; these are the ones it had handed over when
        Craft ended the turn itself (an agent stopped for ignoring a cancel: what it wrote
        before it died is read after the end)."""
        kept = [event for event in events if event[0] not in TURN_UPDATES]
        if dropped := len(events) - len(kept):
            self.late_updates_dropped += dropped
            logger.warning(
                "session %s: %d updates of the agent came after its turn ended; dropped",
                self.session_id, dropped,
            )  # fmt: skip
        return kept

    # --- the agent's controls (see craft.turns.controls) ----------------------------------

    async def _control_connection(self) -> AgentConnection:
        """Return the live agent connection for a control, starting the agent if needed."""
        connection = self.connection
        if connection is not None and connection.is_running:
            return connection
        if self.running:
            raise Refused("agent_starting", "the agent is starting; try again in a moment")
        try:
            return await self.connection_for_turn(wait_for_sandbox=False)
        except Session.DoesNotExist:
            raise
        except Exception as exc:
            raise Refused("agent_unavailable", f"the agent could not start: {exc}") from exc

    async def start_agent(self) -> None:
        """Start the agent ahead of the first prompt (its `agent_info` and commands are then
        stored, and the session's first checkpoint taken in the background): nothing while
        a turn runs, the agent runs or the sandbox is not running. An agent (or sandbox) that
        fails to start is refused (`agent_not_started`) saying why, in the agent's words when
        it wrote to stderr, so that the page tells the person before they write; nothing is
        stored, and the first prompt tries again. Other failures are only logged."""
        connection = self.connection
        if self.running or self.closing or (connection and connection.is_running):
            return
        if await records.sandbox_status(self.session_id) != Sandbox.Status.RUNNING:
            return
        if self.repository.preparing or await records.repository_preparing(self.session_id):
            # No agent in a half-made workspace: the clone starts it once it is ready.
            self.prepare_repository()
            return
        try:
            await self.connection_for_turn(wait_for_sandbox=False)
        except Session.DoesNotExist:
            raise
        except Exception as exc:
            logger.info("session %s: the agent did not start ahead of a prompt: %s",
                        self.session_id, exc)  # fmt: skip
            if isinstance(exc, AgentError | SandboxError):  # the agent's trouble, or its sandbox's
                raise Refused("agent_not_started", start_said(exc)) from None
            return  # Craft's own (a lease lost meanwhile, a key missing): the prompt says it
        if not self.running:
            # Its workspace exists now: record it before any turn, off the first prompt's
            # path (the first turn confirms it is still the workspace's state).
            self.checkpoints.take_first_early()
        async with self._lock:
            await self.queue.length()  # known before the first prompt, off its path

    async def set_config_option(self, config_id: str, value: str) -> None:
        """Change one of the agent's session config options; the log records the new ones."""
        connection = await self._control_connection()
        controls.check_config_choice(connection.config_options, config_id, value)
        try:
            options = await call_agent(connection.set_config_option, config_id, value)
        except AgentError as exc:
            raise Refused("agent_refused", f"the agent refused: {exc}") from exc
        await self._append_control(controls.config_event(options))

    async def set_mode(self, mode_id: str) -> None:
        """Switch the agent to one of its modes; the log records the new mode."""
        connection = await self._control_connection()
        controls.check_mode(connection.modes, mode_id)
        try:
            await call_agent(connection.set_mode, mode_id)
        except AgentError as exc:
            raise Refused("agent_refused", f"the agent refused: {exc}") from exc
        await self._append_control(controls.mode_event(mode_id))

    async def _append_control(self, events: Events) -> None:
        """Store what a control changed; a worker that lost the session meanwhile stops."""
        try:
            await self.append(events)
        except Fenced:
            await self.drop_connection()
            raise Refused(
                "unavailable", "another server took this session over; try again"
            ) from None

    def watch_titles(self, events: Events) -> None:
        """Let the session's title follow the agent's (after the events that named it)."""
        for title in controls.agent_titles(events):
            asyncio.get_running_loop().create_task(self._take_agent_title(title))

    async def _take_agent_title(self, title: str) -> None:
        try:
            await db_calls.run(
                partial(set_session_title, self.session_id, title, "agent", fence=self.fence)
            )
        except Exception:
            logger.exception("session %s: taking the agent's title failed", self.session_id)


async def _prepare_repository(runner: SessionRunner, prepare: PrepareRepository) -> None:
    runner.prepare_repository()  # it runs in the background


# What carries out each of a session's commands (craft.commands) in its runner.
CARRIED_OUT_BY: dict[type[SessionCommand], Callable[[SessionRunner, Any], Awaitable[object]]] = {
    Prompt: lambda runner, prompt: runner.prompt(prompt),
    Cancel: lambda runner, cancel: runner.cancel(),
    AnswerPermission: lambda runner, answer: runner.answer_permission(
        answer.request, answer.option
    ),
    AnswerElicitation: lambda runner, answer: runner.answer_elicitation(
        answer.request, answer.action, answer.content
    ),
    SetConfigOption: lambda runner, change: runner.set_config_option(change.config, change.value),
    SetMode: lambda runner, change: runner.set_mode(change.mode),
    Revert: lambda runner, revert: runner.revert(revert.seq, revert.path, revert.hunk),
    Fork: lambda runner, fork: runner.fork(fork.seq, UUID(fork.new_id), fork.before),
    Rewind: lambda runner, rewind: runner.rewind(rewind.seq),
    EditQueued: lambda runner, edit: runner.queue.edit(edit.id, edit.text),
    RemoveQueued: lambda runner, remove: runner.queue.remove(remove.id),
    SendNow: lambda runner, send: runner.queue.send_now(send.id),
    RunQueue: lambda runner, run: runner.queue.run(),
    StartAgent: lambda runner, start: runner.start_agent(),
    PrepareRepository: _prepare_repository,
    CommitRepository: lambda runner, commit: runner._ship(runner.repository.commit(commit.message)),
    PushRepository: lambda runner, push: runner._ship(runner.repository.push()),
    OpenPullRequest: lambda runner, pr: runner._ship(
        runner.repository.open_pull_request(pr.title, pr.body, pr.link)
    ),
    UpdateRepository: lambda runner, update: runner._ship(runner.repository.update()),
    RefreshPullRequest: lambda runner, refresh: runner.repository.refresh_pull_request(),
}
