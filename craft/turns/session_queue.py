"""A session's queue as its runner runs it: prompts that wait for a turn or a sandbox.

The rows and their events live in `craft.turns.queue` (each change in one transaction, so
every worker sees the same queue); a `SessionQueue` is one runner's side of them: how many
prompts it knows to wait (read once, then counted), starting the head when a turn ends or the
sandbox is ready, and steering. It reaches its session only through `QueuedSession`, what the
runner (`craft.turns.runner`) offers it; all its methods run on the event loop.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from typing import Any, Protocol
from uuid import UUID

from django.db import IntegrityError

from craft.commands import Prompt
from craft.models import Session
from craft.storage.db import db_calls
from craft.storage.eventlog import Fence, Fenced
from craft.turns import queue, records
from sandboxes.models import Sandbox

logger = logging.getLogger(__name__)

# How often a session with prompts waiting for its sandbox looks whether it is ready.
SANDBOX_POLL_SECONDS = 0.5


class QueuedSession(Protocol):
    """What a session's queue needs of its runner."""

    @property
    def fence(self) -> Fence | None: ...  # the lease its changes are stored under

    @property
    def closing(self) -> bool: ...  # the server is shutting down: no new turns

    @property
    def running(self) -> bool: ...  # a turn runs

    @property
    def task(self) -> asyncio.Task[None] | None: ...  # the last turn's

    def agent_running(self) -> bool: ...

    async def cancel(self) -> None: ...  # the running turn

    def prepare_repository(self) -> None: ...  # the queue moves on once it is ready

    async def settle(self) -> None: ...  # what must be stored before a turn starts

    def start_turn(self, prompt: Prompt, prompt_seq: int) -> None: ...

    async def take_title(self, prompt: Prompt) -> None: ...


class SessionQueue:
    """Run one session's queued prompts, one turn at a time, under its runner's `lock`."""

    def __init__(self, session_id: UUID, session: QueuedSession, lock: asyncio.Lock) -> None:
        self.session_id = session_id
        self.session = session
        self.lock = lock  # the runner's: one change of the session at a time
        # How many prompts wait in the session's queue (None: not known here; read it).
        self.known: int | None = None
        self._waiting_for_sandbox: asyncio.Task[None] | None = None

    @property
    def waiting_for_sandbox(self) -> bool:
        """Whether queued prompts wait here for the sandbox to be ready."""
        return self._waiting_for_sandbox is not None and not self._waiting_for_sandbox.done()

    def forget(self) -> None:
        """Forget how many prompts wait: another worker may change the queue meanwhile."""
        self.known = None

    async def length(self) -> int:
        """Return how many prompts wait (read once, then counted here)."""
        if self.known is None:
            self.known = await db_calls.run(queue.waiting, self.session_id)
        return self.known

    async def add(self, prompt: Prompt, sandbox_starting: bool) -> bool:
        """Queue the prompt (under the runner's lock); see that the queue moves on. False
        (nothing stored) for a prompt id already used."""
        if not await self._store(prompt):
            return False
        if sandbox_starting:
            self._wait_for_sandbox()
        elif not self.session.running:
            self.moves_on()  # the queue was not empty: its head goes first
        return True

    async def add_for_repository(self, prompt: Prompt) -> bool:
        """Queue a prompt that came before the session's repository was cloned (under the
        runner's lock), and see that the clone is being made: the queue runs once it is."""
        if not await self._store(prompt):
            return False
        self.session.prepare_repository()
        return True

    async def _store(self, prompt: Prompt) -> bool:
        if not await db_calls.run(queue.enqueue, self.session_id, prompt, self.session.fence):
            return False
        self.known = (self.known or 0) + 1
        return True

    async def change(self, change: Any, *args: Any) -> None:
        """Make one change of `craft.turns.queue` (edit, remove, steer) under the lease."""
        async with self.lock:
            await db_calls.run(change, self.session_id, *args, self.session.fence)

    async def edit(self, client_id: str, text: str) -> None:
        await self.change(queue.edit, client_id, text)

    async def remove(self, client_id: str) -> None:
        await self.change(queue.remove, client_id)
        self.known = None

    async def send_now(self, client_id: str) -> None:
        """Steer: move a queued prompt to the head of the queue and cancel the running turn;
        its end starts that prompt."""
        await self.change(queue.steer, client_id)
        if self.session.running:
            await self.session.cancel()
        else:
            await self.run()

    def moves_on(self) -> None:
        """Start the queue's next prompt in the background (a turn just ended)."""
        if self.known != 0 and not self.session.closing:
            asyncio.get_running_loop().create_task(
                self._run_logged(), context=contextvars.Context()
            )

    async def _run_logged(self) -> None:
        task = self.session.task
        if task is not None and task is not asyncio.current_task() and not task.done():
            await asyncio.wait([task])  # called from the turn's end: let the turn finish
        try:
            await self.run()
        except (Fenced, Session.DoesNotExist):
            pass  # another worker runs the session now, or it is gone
        except Exception:
            logger.exception("session %s: starting a queued prompt failed", self.session_id)

    async def run(self) -> None:
        """Start the next queued prompt, unless a turn runs, the server is closing or the
        sandbox is not ready (then it starts once it is)."""
        session = self.session
        async with self.lock:
            if session.closing or session.running:
                return
            if not session.agent_running():
                status, _, cloning = await records.sandbox_for_prompt(self.session_id)
                if cloning:
                    session.prepare_repository()
                    return
                if status == Sandbox.Status.PROVISIONING:
                    self._wait_for_sandbox()
                    return
            await session.settle()
            try:
                started = await db_calls.run(queue.start_next, self.session_id, session.fence)
            except IntegrityError:  # a turn of a gone worker is in the way: recovery closes it
                return
            if started is None:
                self.known = 0
                return
            prompt, stored = started
            self.known = None if self.known is None else max(self.known - 1, 0)
            session.start_turn(prompt, stored.first_seq)
        await session.take_title(prompt)

    def _wait_for_sandbox(self) -> None:
        """Run the queue once the session's sandbox is ready (looked at every half second)."""
        if not self.waiting_for_sandbox:
            self._waiting_for_sandbox = asyncio.get_running_loop().create_task(
                self._sandbox_ready(), context=contextvars.Context()
            )

    async def _sandbox_ready(self) -> None:
        while await records.sandbox_status(self.session_id) == Sandbox.Status.PROVISIONING:
            if self.session.closing or self.known == 0:
                return
            await asyncio.sleep(SANDBOX_POLL_SECONDS)
        await self._run_logged()
