"""The per-process cache of live agent connections, keyed by (sandbox id, session id).

One session has one agent process, reused for every prompt: an agent keeps its conversation in
memory, so a new process per message would forget the previous turns. The cache creates a
connection on first use, hands the same one back while it is alive, replaces it when it died,
and stops connections when their session or sandbox goes away.

Creation happens under a per-key lock: two concurrent first prompts for one session start one
agent, never two (a check-then-create race would leave two agents working in one folder).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from uuid import UUID

from .acp import AgentConnection

logger = logging.getLogger(__name__)

Key = tuple[UUID, UUID]


class ConnectionCache:
    """Thread-safe map of live `AgentConnection`s; methods block, call them off the event loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards the two dicts, never held while starting agents
        self._connections: dict[Key, AgentConnection] = {}
        self._key_locks: dict[Key, threading.Lock] = {}

    def _key_lock(self, key: Key) -> threading.Lock:
        with self._lock:
            return self._key_locks.setdefault(key, threading.Lock())

    def get_or_start(
        self, sandbox_id: UUID, session_id: UUID, start: Callable[[], AgentConnection]
    ) -> AgentConnection:
        """Return the session's live connection, starting one with `start()` if needed.

        A cached connection that is no longer running is stopped and replaced.
        """
        key = (sandbox_id, session_id)
        with self._key_lock(key):
            with self._lock:
                connection = self._connections.get(key)
            if connection is not None:
                if connection.is_running:
                    return connection
                logger.info("agent for session %s is gone; starting a new one", session_id)
                self._discard(key, connection)
            connection = start()
            with self._lock:
                self._connections[key] = connection
            return connection

    def get(self, sandbox_id: UUID, session_id: UUID) -> AgentConnection | None:
        with self._lock:
            return self._connections.get((sandbox_id, session_id))

    def stop_session(self, sandbox_id: UUID, session_id: UUID) -> bool:
        """Stop and forget the session's connection; return whether there was one."""
        key = (sandbox_id, session_id)
        with self._key_lock(key):
            with self._lock:
                connection = self._connections.get(key)
            if connection is None:
                return False
            self._discard(key, connection)
            return True

    def stop_sandbox(self, sandbox_id: UUID) -> int:
        """Stop every connection of the sandbox (none of another's); return how many."""
        return self._stop_where(lambda key, _conn: key[0] == sandbox_id)

    def stop_idle(self, sandbox_id: UUID | None, idle_seconds: float) -> int:
        """Stop connections without a running turn, unused for `idle_seconds`."""
        now = time.monotonic()

        def idle(key: Key, conn: AgentConnection) -> bool:
            return (
                (sandbox_id is None or key[0] == sandbox_id)
                and not conn.turn_active
                and now - conn.last_used_at >= idle_seconds
            )

        return self._stop_where(idle)

    def stop_all(self) -> int:
        return self._stop_where(lambda _key, _conn: True)

    def count(self, sandbox_id: UUID | None = None) -> int:
        """Return how many live connections this process holds (for one sandbox or all)."""
        with self._lock:
            return sum(
                1
                for key, conn in self._connections.items()
                if (sandbox_id is None or key[0] == sandbox_id) and conn.is_running
            )

    def _stop_where(self, matches: Callable[[Key, AgentConnection], bool]) -> int:
        with self._lock:
            # Keys with a lock include connections being started right now: waiting for their
            # key lock lets a start finish, so that it is stopped too rather than missed.
            keys = list(self._key_locks)
        doomed: list[tuple[Key, AgentConnection]] = []
        for key in keys:
            with self._key_lock(key), self._lock:
                connection = self._connections.get(key)
                if connection is not None and matches(key, connection):
                    del self._connections[key]
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
        self._stop(key, connection)

    @staticmethod
    def _stop(key: Key, connection: AgentConnection) -> None:
        try:
            connection.stop()
        except Exception:
            logger.exception("stopping agent connection %s failed", key)


agent_connections = ConnectionCache()
