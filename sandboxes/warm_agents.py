"""Warm agents: agents started and initialized before the session that will use them exists.

Each running sandbox keeps up to `CRAFT_WARM_AGENTS` of them in each server process (the
connection cache holds them, see `sandboxes.agent.connections`): spawned in the sandbox's
`warm_path` with exactly the environment its next session's agent would get (the same
`Launch`: catalog entry and its owner's credentials), with `initialize` answered and no ACP
session yet. A new session of that sandbox whose agent would be started for an equal launch
takes one: its workspace is made, and `session/new` names it as `cwd`, which ACP requires the
agent to work in. So its first prompt pays `session/new` and the prompt, not the spawn. A
session whose agent is gone (stopped as idle, killed, a restart) takes one the same way to
continue its earlier agent session (`session/resume` or `session/load`, with its `cwd`).

Which agent: the one a session of the sandbox was last started with (`want`, after every
session agent start), or, when a sandbox becomes running, its owner's most likely one as
the app that owns sessions says (`likely_launch`: the agent of the latest session, else the
catalog's first; None when the owner's credentials for it are missing, and then none is
kept). A warm agent started for another launch (another agent, a key changed since) is
stopped, never handed out.

Refills run on threads of their own (`craft-warm`), never on a request's path: after a
warm agent is taken, after one died while waiting (found by the reaper's agent pass or by a
session that wanted it), when a sandbox becomes running. After a session agent starts, the
refill waits until no other one has started in that sandbox for `REFILL_SETTLE` seconds: in
a burst of new sessions, spawning warm agents would compete with the agents people wait for
(docs/history/performance-diary.md, "On a quiet machine,
and warm refills after a burst"). A warm agent idle for
`CRAFT_AGENT_IDLE_SECONDS` (no session agent started in its sandbox for that long) is reaped
like any idle agent and not replaced until the sandbox is used again; after
`MAX_FAILURES` warm starts in a row failed or died, a sandbox gets none until its next use.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from uuid import UUID

from django.conf import settings
from django.db import connection as db_connection

from .agent.connection import AgentConnection
from .agent.connections import agent_connections
from .backends import get_backend
from .catalog import Launch
from .models import Sandbox

logger = logging.getLogger(__name__)

# Warm agents started at once by this process (a start is mostly the agent's own CPU; the
# local backend's start slots bound them further).
WARMING_THREADS = 4
# Warm starts that failed (or agents that died while waiting) in a row before a sandbox gets
# no more until its next use.
MAX_FAILURES = 3
# How long a sandbox must go without a session agent start before its warm agents are
# refilled (see the module docstring).
REFILL_SETTLE = 1.0

# Set by the app that owns sessions (craft): the owner's most likely launch, or None.
LikelyLaunch = Callable[[int], Launch | None]


class WarmAgents:
    """Keep warm agents for running sandboxes; every method returns at once."""

    def __init__(self) -> None:
        self._threads = ThreadPoolExecutor(WARMING_THREADS, thread_name_prefix="craft-warm")
        self._lock = threading.Lock()
        # Sandboxes with a refill queued or running -> the launch it is for (the latest).
        self._wanted: dict[UUID, tuple[Sandbox, Launch | None]] = {}
        self._failures: dict[UUID, int] = {}
        self._used_at: dict[UUID, float] = {}  # the latest session agent start (monotonic)
        self.likely_launch: LikelyLaunch | None = None
        self._closed = False

    def close(self) -> None:
        """Start no more warm agents (the process is stopping)."""
        self._closed = True

    @staticmethod
    def enabled() -> bool:
        return settings.CRAFT_WARM_AGENTS > 0

    def want(self, sandbox: Sandbox, launch: Launch) -> None:
        """A session agent of the sandbox was just started for `launch`: keep warm agents
        for it (the sandbox is in use: their idle time starts again)."""
        if not self.enabled():
            return
        with self._lock:
            self._failures.pop(sandbox.pk, None)
            self._used_at[sandbox.pk] = time.monotonic()
        agent_connections.touch_warm(sandbox.pk)
        self._refill_later(sandbox, launch)

    def sandbox_ready(self, sandbox: Sandbox) -> None:
        """The sandbox just became running: warm its owner's most likely agent."""
        if self.enabled() and self.likely_launch is not None:
            self._refill_later(sandbox, None)

    def replace_dead(self) -> int:
        """Stop warm agents that died while waiting, and start others in their place in the
        background; return how many died. Called by the reaper's agent pass."""
        dead = 0
        for key, connection, launch in agent_connections.warm():
            if connection.is_running or not agent_connections.stop_warm(key, connection):
                continue
            dead += 1
            logger.info("warm agent %s died while waiting", connection.process.ident)
            sandbox = Sandbox.objects.filter(pk=key[0], status=Sandbox.Status.RUNNING).first()
            if sandbox is not None and isinstance(launch, Launch) and self._note_failure(key[0]):
                self._refill_later(sandbox, launch)
        return dead

    # --- on the warming threads -----------------------------------------------------------

    def _note_failure(self, sandbox_id: UUID) -> bool:
        """Count a failed or dead warm agent; return whether the sandbox may get another."""
        with self._lock:
            self._failures[sandbox_id] = self._failures.get(sandbox_id, 0) + 1
            return self._failures[sandbox_id] < MAX_FAILURES

    def _refill_later(self, sandbox: Sandbox, launch: Launch | None) -> None:
        if self._closed:
            return
        with self._lock:
            queued = sandbox.pk in self._wanted
            self._wanted[sandbox.pk] = (sandbox, launch)
        if not queued:
            self._threads.submit(self._refill_loop, sandbox.pk)

    def _settle(self, sandbox_id: UUID) -> None:
        """Wait until the sandbox has had no session agent start for REFILL_SETTLE."""
        while not self._closed:
            with self._lock:
                quiet = time.monotonic() - self._used_at.get(sandbox_id, float("-inf"))
            if quiet >= REFILL_SETTLE:
                with self._lock:
                    self._used_at.pop(sandbox_id, None)
                return
            time.sleep(REFILL_SETTLE - quiet)

    def _refill_loop(self, sandbox_id: UUID) -> None:
        try:
            while True:
                self._settle(sandbox_id)
                with self._lock:
                    wanted = self._wanted[sandbox_id]
                try:
                    self._refill(*wanted)
                except Exception:
                    logger.exception("warming agents of sandbox %s failed", sandbox_id)
                with self._lock:
                    if self._wanted[sandbox_id] is wanted:
                        del self._wanted[sandbox_id]
                        return
        finally:
            db_connection.close()

    def _refill(self, sandbox: Sandbox, launch: Launch | None) -> None:
        """Stop the sandbox's warm agents that are dead or for another launch; start new
        ones up to CRAFT_WARM_AGENTS while there is room (never stopping anyone for it)."""
        wanted = settings.CRAFT_WARM_AGENTS
        if wanted <= 0:
            return
        if not Sandbox.objects.filter(pk=sandbox.pk, status=Sandbox.Status.RUNNING).exists():
            return
        if launch is None:
            assert self.likely_launch is not None
            launch = self.likely_launch(sandbox.owner_id)
        have = 0
        for key, connection, theirs in agent_connections.warm(sandbox.pk):
            if launch is not None and theirs == launch and connection.is_running:
                have += 1
            elif agent_connections.stop_warm(key, connection) and not connection.is_running:
                self._note_failure(sandbox.pk)
        if launch is None:
            return  # its owner's credentials for it are missing: none is kept warm
        while have < wanted and not self._closed:
            with self._lock:
                if self._failures.get(sandbox.pk, 0) >= MAX_FAILURES:
                    return
            try:
                started = agent_connections.start_warm(
                    sandbox.pk, launch, lambda: start_warm_connection(sandbox, launch)
                )
            except Exception as exc:
                logger.warning("a warm agent did not start in sandbox %s: %s", sandbox.pk, exc)
                self._note_failure(sandbox.pk)
                continue
            if started is None:
                return  # no room: warm agents never push anyone out
            have += 1


def start_warm_connection(sandbox: Sandbox, launch: Launch) -> AgentConnection:
    """Start the launch's agent in the sandbox's `warm_path` and initialize it (no session)."""
    backend = get_backend(sandbox.backend)
    with backend.start_slots or contextlib.nullcontext():
        process = backend.start_warm_agent(sandbox, launch)
        connection = AgentConnection(
            process,
            cwd=backend.warm_path(sandbox),
            max_message_bytes=settings.CRAFT_MAX_MESSAGE_BYTES,
            max_terminal_bytes=settings.CRAFT_MAX_TERMINAL_OUTPUT_BYTES,
            credentials=launch.agent.credentials,
        )
        connection.initialize(timeout=settings.CRAFT_AGENT_START_TIMEOUT)
    logger.info("started warm agent %s in sandbox %s", process.ident, sandbox.pk)
    return connection


warm_agents = WarmAgents()
