"""The per-process cache of live agent connections, keyed by (sandbox id, session id).

One session has one agent process, reused for every prompt: an agent keeps its conversation in
memory, so a new process per message would forget the previous turns. The cache creates a
connection on first use, hands the same one back while it is alive, replaces it when it died,
and stops connections when their session or sandbox goes away, or when they sat idle.

Creation happens under a per-key lock: two concurrent first prompts for one session start one
agent, never two (a check-then-create race would leave two agents working in one folder). Only
the keys concerned are locked: stopping sandbox A's agents waits for agent starts in A (so that
they are stopped too), never for starts in B. A key's lock is dropped once the key has no
connection and nobody holds or waits for the lock. Stopping one session's agent does not wait
for its start: it stops the process being started (`starting`), and the start raises
`StartStopped` (a session deleted while its agent starts is deleted at once, not after the
start or its timeout).

The cache holds at most `CRAFT_MAX_AGENT_CONNECTIONS` agents (starts under way included). A
start beyond that stops the longest-idle connection without a running turn first; when every
connection is in a turn, the start is refused.

It also holds warm agents (`sandboxes.warm_agents`): agents of a sandbox, initialized but in no
session yet, each under a key of its own (the sandbox id and a random id) and marked with what
it was started for (its `Launch`). They count against both limits like any agent, make room
first (they hold no conversation), are stopped with their sandbox and reaped when idle, and
are handed to a session of their own sandbox only (`get_or_start`'s `adopt`), whose agent
would have been started for the very same launch.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from uuid import UUID, uuid4

from django.conf import settings

from ..backends import SandboxError
from .connection import AgentConnection

logger = logging.getLogger(__name__)

Key = tuple[UUID, UUID]


class TooManyAgents(SandboxError):
    """The cache is full of connections that are all in a turn."""


class StartStopped(SandboxError):
    """The session's agent was stopped (`stop_session`) while it started."""


@dataclass
class _Start:
    """A session agent's start under way, which `stop_session` stops."""

    stopped: bool = False
    connection: AgentConnection | None = None  # once its process is there


@dataclass
class _KeyLock:
    lock: threading.Lock
    users: int = 0  # threads holding or waiting for `lock`; the entry goes when none is left


class ConnectionCache:
    """Thread-safe map of live `AgentConnection`s; methods block, call them off the event loop."""

    def __init__(self, max_size: int | None = None) -> None:
        self._lock = threading.Lock()  # guards the dicts and counts, never held while waiting
        self._connections: dict[Key, AgentConnection] = {}
        self._key_locks: dict[Key, _KeyLock] = {}
        self._starting = 0  # starts under way (they count against the maximum)
        self._max_size = max_size
        # Keys of warm agents -> what each was started for (compared with ==, never shown).
        self._warm: dict[Key, object] = {}
        self._warming: dict[Key, object] = {}  # the same, for warm agents still starting
        self._starts: dict[Key, _Start] = {}  # session agents being started

    @property
    def max_size(self) -> int:
        return self._max_size or settings.CRAFT_MAX_AGENT_CONNECTIONS

    @contextlib.contextmanager
    def _locked(self, key: Key, *, blocking: bool = True) -> Iterator[bool]:
        """Hold the key's lock (yield True), or yield False if `blocking` is off and it is taken.

        The entry is counted while used, so that it is never dropped while someone holds or
        waits for it (two locks for one key would let two agents start).
        """
        with self._lock:
            entry = self._key_locks.get(key)
            if entry is None:
                entry = self._key_locks[key] = _KeyLock(threading.Lock())
            entry.users += 1
        acquired = entry.lock.acquire(blocking)
        try:
            yield acquired
        finally:
            if acquired:
                entry.lock.release()
            with self._lock:
                entry.users -= 1
                if not entry.users and key not in self._connections:
                    del self._key_locks[key]

    def get_or_start(
        self,
        sandbox_id: UUID,
        session_id: UUID,
        start: Callable[[], AgentConnection],
        *,
        adopt: Callable[[AgentConnection], AgentConnection] | None = None,
        launch: object = None,
    ) -> AgentConnection:
        """Return the session's live connection, starting one with `start()` if needed.

        A cached connection that is no longer running is stopped and replaced. With `adopt`,
        a live warm agent of the sandbox that was started for `launch` (equal) is taken
        first, in the place it held, and `adopt(warm)` opens the session on it; if that fails,
        `start()` runs instead. When the only such warm agent is still starting, the session
        waits for it: it began first, so it is ready sooner than a new start would be. Dead
        warm agents met on the way are stopped, never handed out. Raises TooManyAgents when
        the cache is full and every connection in it is in a turn, and StartStopped when
        `stop_session` stopped the start (a start waiting for a warm agent that is itself
        still starting is stopped once that one is there).
        """
        key = (sandbox_id, session_id)
        with self._locked(key):
            with self._lock:
                connection = self._connections.get(key)
            if connection is not None:
                if connection.is_running:
                    return connection
                logger.info("agent for session %s is gone; starting a new one", session_id)
                self._discard(key, connection)
            under_way = _Start()
            with self._lock:
                self._starts[key] = under_way
            try:
                warm = self._take_warm(sandbox_id, launch) if adopt is not None else None
                if warm is None:
                    self._reserve_place(key)
            except BaseException:
                with self._lock:
                    del self._starts[key]
                raise
            try:
                connection = None
                if warm is not None and adopt is not None:
                    self.starting(sandbox_id, session_id, warm)
                    try:
                        connection = adopt(warm)
                    except Exception as exc:
                        logger.info("warm agent %s: %s; starting another", warm.process.ident, exc)
                        self._stop(key, warm)
                if connection is None and not under_way.stopped:
                    connection = start()
            except BaseException as exc:
                with self._lock:
                    self._starting -= 1
                    del self._starts[key]
                if under_way.stopped:
                    raise StartStopped(f"the agent was stopped while it started: {exc}") from exc
                raise
            with self._lock:
                self._starting -= 1
                del self._starts[key]
                stopped = under_way.stopped or connection is None  # None: start() skipped
                if connection is not None and not stopped:
                    self._connections[key] = connection
            if stopped:  # before it was cached: stop what it started
                if connection is not None:
                    connection.stop()
                raise StartStopped("the agent was stopped while it started")
            assert connection is not None
            return connection

    def starting(self, sandbox_id: UUID, session_id: UUID, connection: AgentConnection) -> None:
        """Note the connection a session agent's start (`get_or_start`) has just spawned; it is
        stopped at once if `stop_session` came first, and by `stop_session` until it is
        cached."""
        with self._lock:
            under_way = self._starts.get((sandbox_id, session_id))
            if under_way is not None:
                under_way.connection = connection
            stopped = under_way is not None and under_way.stopped
        if stopped:
            connection.stop()

    # --- warm agents ----------------------------------------------------------------------

    def start_warm(
        self, sandbox_id: UUID, launch: object, start: Callable[[], AgentConnection]
    ) -> AgentConnection | None:
        """Start a warm agent for the sandbox with `start()`, if there is room for it without
        stopping anyone (under both limits); return it, or None when there was no room.

        Its key is locked while it starts, so that stopping the sandbox waits for it and
        stops it too.
        """
        key = (sandbox_id, uuid4())
        with self._locked(key):
            with self._lock:
                per_sandbox = settings.CRAFT_MAX_AGENTS_PER_USER
                mine = sum(1 for other in self._connections if other[0] == sandbox_id)
                if (per_sandbox and mine >= per_sandbox) or (
                    len(self._connections) + self._starting >= self.max_size
                ):
                    return None
                self._starting += 1
                self._warming[key] = launch
            try:
                connection = start()
            finally:
                with self._lock:
                    self._starting -= 1
                    del self._warming[key]
            with self._lock:
                self._connections[key] = connection
                self._warm[key] = launch
            return connection

    def _take_warm(self, sandbox_id: UUID, launch: object) -> AgentConnection | None:
        """Take a live warm agent of the sandbox started for `launch` out of the cache,
        keeping its place as a start under way; stop dead ones met on the way. With none
        ready, wait for one being started for `launch` and take it."""
        with self._lock:
            ready = [key for key in self._warm if key[0] == sandbox_id]
            starting = [
                key for key, theirs in self._warming.items()
                if key[0] == sandbox_id and theirs == launch
            ]  # fmt: skip
        for key in ready:
            with self._locked(key, blocking=False) as acquired:
                if acquired and (connection := self._take_if_live(key, launch)):
                    return connection
        for key in starting:
            with self._locked(key):  # until its start ended
                if connection := self._take_if_live(key, launch):
                    return connection
        return None

    def _take_if_live(self, key: Key, launch: object) -> AgentConnection | None:
        """Take the warm agent under `key` (its lock held) if it is live and for `launch`;
        stop it if it died."""
        with self._lock:
            connection = self._connections.get(key)
            if connection is None or key not in self._warm:
                return None
            if connection.is_running and self._warm[key] == launch:
                del self._connections[key], self._warm[key]
                self._starting += 1  # its place, until the session has it
                return connection
        if not connection.is_running:
            logger.info("warm agent %s died while waiting", connection.process.ident)
            self._discard(key, connection)
        return None

    def warm(self, sandbox_id: UUID | None = None) -> list[tuple[Key, AgentConnection, object]]:
        """Return the warm agents (of one sandbox, or all): key, connection, launch."""
        with self._lock:
            return [
                (key, self._connections[key], launch)
                for key, launch in self._warm.items()
                if sandbox_id is None or key[0] == sandbox_id
            ]

    def is_warm(self, key: Key) -> bool:
        with self._lock:
            return key in self._warm

    def stop_warm(self, key: Key, connection: AgentConnection) -> bool:
        """Stop one warm agent unless it was handed out or stopped meanwhile."""
        with self._locked(key, blocking=False) as acquired:
            if not acquired:
                return False
            with self._lock:
                if self._connections.get(key) is not connection:
                    return False
            self._discard(key, connection)
            return True

    def touch_warm(self, sandbox_id: UUID) -> None:
        """The sandbox is in use: its warm agents' idle time starts again."""
        now = time.monotonic()
        for _key, connection, _launch in self.warm(sandbox_id):
            connection.last_used_at = now

    def _reserve_place(self, key: Key) -> None:
        """Count one more start, first stopping the longest-idle connection if the sandbox
        has as many agents as one user may run, or the cache is full.

        Connections whose agent died go first, then the idle ones, longest idle first; one in
        a turn (or an open permission request) is never evicted. A connection whose key lock
        is taken (being started, stopped or handed out right now) is passed over.
        """
        per_sandbox = settings.CRAFT_MAX_AGENTS_PER_USER
        while True:
            with self._lock:
                mine = [other for other in self._connections if other[0] == key[0]]
                if per_sandbox and len(mine) >= per_sandbox:
                    candidates = self._eviction_order(key, mine)
                    full = (
                        f"you already have {per_sandbox} agents at work, the most one person "
                        "can have; try again when one of them has finished"
                    )
                elif len(self._connections) + self._starting < self.max_size:
                    self._starting += 1
                    return
                else:
                    candidates = self._eviction_order(key, list(self._connections))
                    full = (
                        f"this server already runs {self.max_size} agents, all of them busy "
                        "(CRAFT_MAX_AGENT_CONNECTIONS); try again when one of them has finished"
                    )
            if not any(self._evict(other, conn) for other, conn in candidates):
                raise TooManyAgents(full)

    def _eviction_order(self, key: Key, keys: list[Key]) -> list[tuple[Key, AgentConnection]]:
        """Return the connections that may be evicted, in the order they go (hold `_lock`)."""
        candidates = [
            (other, self._connections[other])
            for other in keys
            if other != key and not self._connections[other].turn_active
        ]
        # Dead ones first, then warm agents (they hold no conversation), then longest idle.
        return sorted(
            candidates,
            key=lambda pair: (
                pair[1].is_running,
                pair[0] not in self._warm,
                pair[1].last_used_at,
            ),
        )

    def _evict(self, key: Key, connection: AgentConnection) -> bool:
        with self._locked(key, blocking=False) as acquired:
            if not acquired:
                return False
            with self._lock:
                if self._connections.get(key) is not connection or connection.turn_active:
                    return False
                del self._connections[key]
                warm = self._warm.pop(key, None) is not None
        whose = "a warm agent" if warm else f"the agent of session {key[1]}"
        logger.info("evicting %s: the cache is full", whose)
        self._stop(key, connection)
        return True

    def get(self, sandbox_id: UUID, session_id: UUID) -> AgentConnection | None:
        with self._lock:
            return self._connections.get((sandbox_id, session_id))

    def stop_session(self, sandbox_id: UUID, session_id: UUID) -> bool:
        """Stop and forget the session's connection, or stop its start under way (which
        raises StartStopped); return whether there was either."""
        key = (sandbox_id, session_id)
        spawned = None
        with self._lock:
            under_way = self._starts.get(key)
            if under_way is not None:
                under_way.stopped = True
                spawned = under_way.connection
        if spawned is not None:
            spawned.stop()  # its start raises at once, and lets go of the key
        with self._locked(key):
            with self._lock:
                connection = self._connections.get(key)
            if connection is None:
                return under_way is not None
            self._discard(key, connection)
            return True

    def stop_sandbox(self, sandbox_id: UUID) -> int:
        """Stop every connection of the sandbox (none of another's); return how many.

        It waits for agent starts under way in this sandbox (and stops what they started),
        never for starts in another sandbox.
        """
        return self._stop_where(lambda key: key[0] == sandbox_id, wait_for_starts=True)

    def stop_idle(self, sandbox_id: UUID | None, idle_seconds: float) -> int:
        """Stop connections without a running turn, unused for `idle_seconds`."""
        now = time.monotonic()
        return self._stop_where(
            lambda key: sandbox_id is None or key[0] == sandbox_id,
            lambda conn: not conn.turn_active and now - conn.last_used_at >= idle_seconds,
        )

    def idle_keys(self, idle_seconds: float) -> list[Key]:
        """Return the keys of connections without a running turn, unused for `idle_seconds`."""
        now = time.monotonic()
        with self._lock:
            return [
                key
                for key, conn in self._connections.items()
                if not conn.turn_active and now - conn.last_used_at >= idle_seconds
            ]

    def stop_if_idle(self, key: Key, idle_seconds: float) -> bool:
        """Stop the key's connection if it is still idle for `idle_seconds` and in no turn.

        Return whether it was stopped. A connection whose key is busy right now (being
        started or handed out) is left alone.
        """
        now = time.monotonic()
        with self._locked(key, blocking=False) as acquired:
            if not acquired:
                return False
            with self._lock:
                connection = self._connections.get(key)
                if (
                    connection is None
                    or connection.turn_active
                    or now - connection.last_used_at < idle_seconds
                ):
                    return False
                del self._connections[key]
                self._warm.pop(key, None)
        self._stop(key, connection)
        return True

    def stop_all(self) -> int:
        return self._stop_where(lambda _key: True, wait_for_starts=True)

    def count(self, sandbox_id: UUID | None = None, *, warm: bool = True) -> int:
        """Return how many live connections this process holds (for one sandbox or all);
        without `warm`, sessions' agents only."""
        with self._lock:
            return sum(
                1
                for key, conn in self._connections.items()
                if (sandbox_id is None or key[0] == sandbox_id)
                and conn.is_running
                and (warm or key not in self._warm)
            )

    def in_turn(self, sandbox_id: UUID) -> int:
        """Return how many of the sandbox's connections in this process are in a turn."""
        with self._lock:
            return sum(
                1
                for key, conn in self._connections.items()
                if key[0] == sandbox_id and conn.is_running and conn.turn_active
            )

    def sandboxes(self) -> set[UUID]:
        """Return the sandboxes this process holds live sessions' agents of (a warm agent
        alone does not make a sandbox in use)."""
        with self._lock:
            return {
                key[0]
                for key, conn in self._connections.items()
                if conn.is_running and key not in self._warm
            }

    def keys(self) -> list[Key]:
        with self._lock:
            return list(self._connections)

    def _stop_where(
        self,
        key_matches: Callable[[Key], bool],
        connection_matches: Callable[[AgentConnection], bool] = lambda _conn: True,
        *,
        wait_for_starts: bool = False,
    ) -> int:
        """Stop the connections whose key and connection match; return how many.

        Keys are matched before any key lock is taken, so only the matching keys are locked.
        With `wait_for_starts`, a matching key whose agent is being started right now is
        waited for, so that its new connection is stopped too rather than missed; without,
        keys that are busy are skipped.
        """
        with self._lock:
            keys = {key for key in self._connections if key_matches(key)}
            if wait_for_starts:
                keys |= {key for key in self._key_locks if key_matches(key)}
        doomed: list[tuple[Key, AgentConnection]] = []
        for key in keys:
            with self._locked(key, blocking=wait_for_starts) as acquired:
                if not acquired:
                    continue
                with self._lock:
                    connection = self._connections.get(key)
                    if connection is not None and connection_matches(connection):
                        del self._connections[key]
                        self._warm.pop(key, None)
                        doomed.append((key, connection))
        # Stopping one agent can take seconds (it may ignore the end of its input and need
        # signals): stop them all at once.
        if len(doomed) > 1:
            with ThreadPoolExecutor(min(len(doomed), 32)) as pool:
                list(pool.map(lambda pair: self._stop(*pair), doomed))
        elif doomed:
            self._stop(*doomed[0])
        return len(doomed)

    def _discard(self, key: Key, connection: AgentConnection) -> None:
        """Stop a connection and drop it; the caller holds the key lock."""
        with self._lock:
            if self._connections.get(key) is connection:
                del self._connections[key]
                self._warm.pop(key, None)
        self._stop(key, connection)

    @staticmethod
    def _stop(key: Key, connection: AgentConnection) -> None:
        try:
            connection.stop()
        except Exception:
            logger.exception("stopping agent connection %s failed", key)


agent_connections = ConnectionCache()
