"""This process's terminals: shells on a pseudo-terminal in a session's workspace, by id.

A terminal (`Terminal`) belongs to one person, one session and its sandbox, and holds its
shell (`backends.TerminalProcess`, started by the backend where and as the agent runs), the
last `SCROLLBACK_BYTES` of its output (bytes, cut at a UTF-8 character's start) and the
sockets attached to it (`Listener`s). Output reaches every attached socket in order; a socket
that attaches gets the scrollback, then live output, with nothing lost or sent twice between
them (both are taken under one lock). Input is never kept.

A terminal ends when its shell does (its sockets hear `ended` with the exit code, and it is
dropped), when its sandbox is terminated or its session deleted (`close_sandbox`,
`close_session`), and when no socket has been attached to it for `DETACHED_SECONDS`
(`close_abandoned`, from the reaper's frequent pass). While it is open, its sandbox counts as
in use (the reaper's idle rule spares it).

Terminals live in the memory of the server process that started them: a socket reaching
another process finds no terminal of that id there.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Protocol
from uuid import UUID

from django.conf import settings

from .backends import SandboxError, TerminalProcess, get_backend

if TYPE_CHECKING:
    from .models import Sandbox

logger = logging.getLogger(__name__)

# What a terminal keeps of its output for a socket that comes back.
SCROLLBACK_BYTES = 256 * 1024
# How long a terminal with no socket attached stays open for one to come back.
DETACHED_SECONDS = 600.0
# How long the end of a terminal waits for its shell's exit code.
EXIT_CODE_SECONDS = 5.0
# Flow control: the terminal is read no further while a socket has this much of its output
# taken but not sent yet (the shell then waits on a full terminal, as on a slow one). A socket
# that stops reading is closed by its consumer, which frees the terminal; at worst the wait
# gives up after STALL_SECONDS.
IN_FLIGHT_BYTES = 256 * 1024
STALL_SECONDS = 30.0
# With no socket attached, a terminal's output is read at a pace (a pause after each big
# read): a runaway program costs the server little while nobody watches.
DETACHED_PAUSE_SECONDS = 0.005
BIG_READ = 4096

# Where a terminal's end is heard: waiting for the exit code must not hold the pipes' thread.
_ends = ThreadPoolExecutor(max_workers=2, thread_name_prefix="craft-terminal-ends")


class TooManyTerminals(SandboxError):
    """The person has CRAFT_MAX_TERMINALS_PER_USER terminals open already."""


class Listener(Protocol):
    """A socket attached to a terminal. Both are called on the terminal's reading thread (or
    the one that ends it) and must not block. The socket tells the terminal what of the
    output it has sent (`Terminal.sent`): until it has, the terminal is not read further."""

    def output(self, data: bytes) -> None: ...

    def ended(self, code: int | None) -> None: ...


def utf8_tail(data: bytes | bytearray, limit: int) -> bytes:
    """Return the last `limit` bytes of `data` or fewer, starting at a UTF-8 character's
    first byte (never inside one)."""
    start = max(0, len(data) - limit)
    end = min(len(data), start + 3)
    while start < end and 0x80 <= data[start] < 0xC0:  # a continuation byte
        start += 1
    return bytes(data[start:])


class Terminal:
    """One shell on a terminal, its scrollback and the sockets attached to it."""

    def __init__(
        self, owner_id: int, sandbox_id: UUID, session_id: UUID, process: TerminalProcess
    ) -> None:
        self.id = uuid.uuid4().hex
        self.owner_id = owner_id
        self.sandbox_id = sandbox_id
        self.session_id = session_id
        self.process = process
        self._lock = threading.Lock()
        self._drained = threading.Condition(self._lock)
        self._scrollback = bytearray()
        self._listeners: list[Listener] = []
        self._in_flight: dict[int, int] = {}  # id of a listener: bytes taken, not sent
        self.detached_since: float | None = time.monotonic()
        self.closed = False
        self.stopping = False  # being terminated: its output is no longer held back
        self.code: int | None = None
        self.ended = threading.Event()  # its end is told and what it held is gone

    def attach(self, listener: Listener) -> tuple[bytes, bool]:
        """Attach `listener`; return the scrollback (what it gets before live output) and
        whether the terminal is open (False: it ended, and `listener` hears nothing more)."""
        with self._lock:
            if not self.closed:
                self._listeners.append(listener)
                self._in_flight[id(listener)] = 0
                self.detached_since = None
            return utf8_tail(self._scrollback, SCROLLBACK_BYTES), not self.closed

    def detach(self, listener: Listener) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)
            self._in_flight.pop(id(listener), None)
            if not self._listeners and self.detached_since is None:
                self.detached_since = time.monotonic()
            self._drained.notify_all()

    def sent(self, listener: Listener, count: int) -> None:
        """`listener` has sent `count` bytes of what it took (flow control)."""
        with self._lock:
            if id(listener) in self._in_flight:
                self._in_flight[id(listener)] = max(0, self._in_flight[id(listener)] - count)
                self._drained.notify_all()

    def write(self, data: bytes) -> None:
        """Type into the terminal (blocks when `process.writes_block`)."""
        self.process.write(data)

    def resize(self, cols: int, rows: int) -> None:
        self.process.resize(cols, rows)

    def _output(self, data: bytes) -> None:
        """Keep `data` and hand it to every socket; then wait while one of them is behind
        (on the terminal's own reading thread: the shell waits meanwhile)."""
        with self._lock:
            self._scrollback += data
            if len(self._scrollback) > SCROLLBACK_BYTES + SCROLLBACK_BYTES // 4:
                # Cut now and then, not at every chunk: each cut copies the scrollback.
                self._scrollback = bytearray(utf8_tail(self._scrollback, SCROLLBACK_BYTES))
            listeners = list(self._listeners)
            for listener in listeners:
                self._in_flight[id(listener)] += len(data)
        for listener in listeners:
            _tell(listener.output, data)
        if not listeners:
            if len(data) >= BIG_READ:
                time.sleep(DETACHED_PAUSE_SECONDS)
            return
        with self._lock:
            self._drained.wait_for(
                lambda: (
                    self.closed
                    or self.stopping
                    or max(self._in_flight.values(), default=0) <= IN_FLIGHT_BYTES
                ),
                STALL_SECONDS,
            )

    def _stop(self) -> None:
        """Stop holding the output back: the terminal is being terminated."""
        with self._lock:
            self.stopping = True
            self._drained.notify_all()

    def _ended(self, code: int | None) -> None:
        with self._lock:
            self.closed = True
            self.code = code
            listeners, self._listeners = self._listeners, []
            self._in_flight.clear()
            self._drained.notify_all()
        self.ended.set()
        for listener in listeners:
            _tell(listener.ended, code)


def _tell(action: object, *args: object) -> None:
    try:
        action(*args)  # type: ignore[operator]
    except Exception:
        logger.exception("a terminal's socket failed to take its output")


class Terminals:
    """The terminals of this process, by id (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_id: dict[str, Terminal] = {}
        self._starting: dict[int, int] = {}  # owner id: starts under way

    def open(
        self, owner_id: int, sandbox: Sandbox, session_id: UUID, cols: int, rows: int
    ) -> Terminal:
        """Start a terminal for `owner_id` in the session's workspace (blocks while the
        backend starts it). Raises TooManyTerminals past CRAFT_MAX_TERMINALS_PER_USER (starts
        under way count), SandboxError when the backend cannot start it."""
        limit = settings.CRAFT_MAX_TERMINALS_PER_USER
        with self._lock:
            held = self._count(owner_id) + self._starting.get(owner_id, 0)
            if limit and held >= limit:
                raise TooManyTerminals(
                    f"you have {held} terminals open, the most allowed; close one first"
                )
            self._starting[owner_id] = self._starting.get(owner_id, 0) + 1
        try:
            process = get_backend(sandbox.backend).start_terminal(sandbox, session_id, cols, rows)
            terminal = Terminal(owner_id, sandbox.pk, session_id, process)
            with self._lock:
                self._by_id[terminal.id] = terminal
        finally:
            with self._lock:
                self._starting[owner_id] -= 1
                if not self._starting[owner_id]:
                    del self._starting[owner_id]

        def ended() -> None:
            _ends.submit(self._finish, terminal)

        process.listen(terminal._output, ended)
        logger.info(
            "terminal %s started in session %s (%s)", terminal.id, session_id, process.ident
        )
        return terminal

    def get(self, terminal_id: str, owner_id: int, session_id: UUID) -> Terminal | None:
        """Return the open terminal of that id if it is `owner_id`'s, in that session."""
        with self._lock:
            terminal = self._by_id.get(terminal_id)
        if terminal is None or terminal.owner_id != owner_id or terminal.session_id != session_id:
            return None
        return terminal

    def close(self, terminals: Iterable[Terminal]) -> int:
        """Terminate the terminals and wait (a few seconds at most) until each has ended:
        its shell and what it held (its cgroup) gone, its sockets told."""
        closing = list(terminals)
        for terminal in closing:
            terminal._stop()
            try:
                terminal.process.terminate()
            except Exception:
                logger.exception("terminating terminal %s failed", terminal.id)
        for terminal in closing:
            if not terminal.ended.wait(EXIT_CODE_SECONDS + 5):
                logger.warning("terminal %s did not end", terminal.id)
        return len(closing)

    def close_sandbox(self, sandbox_id: UUID) -> int:
        return self.close(self._matching(lambda t: t.sandbox_id == sandbox_id))

    def close_session(self, sandbox_id: UUID, session_id: UUID) -> int:
        return self.close(
            self._matching(lambda t: t.sandbox_id == sandbox_id and t.session_id == session_id)
        )

    def close_abandoned(self, now: float | None = None) -> int:
        """Close the terminals no socket has been attached to for DETACHED_SECONDS."""
        now = time.monotonic() if now is None else now

        def abandoned(terminal: Terminal) -> bool:
            since = terminal.detached_since
            return since is not None and now - since >= DETACHED_SECONDS

        closed = self.close(self._matching(abandoned))
        if closed:
            logger.info("closed %d terminal(s) left without a socket", closed)
        return closed

    def close_all(self) -> int:
        return self.close(self._matching(lambda t: True))

    def sandboxes(self) -> set[UUID]:
        """Return the sandboxes with an open terminal in this process."""
        with self._lock:
            return {terminal.sandbox_id for terminal in self._by_id.values()}

    def count(self, owner_id: int) -> int:
        with self._lock:
            return self._count(owner_id)

    def _count(self, owner_id: int) -> int:
        return sum(1 for terminal in self._by_id.values() if terminal.owner_id == owner_id)

    def _matching(self, wanted: object) -> list[Terminal]:
        with self._lock:
            return [t for t in self._by_id.values() if wanted(t)]  # type: ignore[operator]

    def _finish(self, terminal: Terminal) -> None:
        """The terminal closed: drop it, make sure its shell is gone, tell its sockets."""
        with self._lock:
            self._by_id.pop(terminal.id, None)
        code = terminal.process.wait_exit(EXIT_CODE_SECONDS)
        if code is not None and code < 0:
            code = 128 - code  # killed by a signal: as a shell says it
        try:
            terminal.process.terminate()  # what may hold on (a jail, a cgroup): gone too
        except Exception:
            logger.exception("terminating terminal %s failed", terminal.id)
        terminal._ended(code)
        logger.info("terminal %s ended (exit code %s)", terminal.id, code)


terminals = Terminals()
