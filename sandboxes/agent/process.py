"""An agent program as the ACP client sees it: bytes in, lines out.

A backend starts the program (a local subprocess, a command in a pod) and hands
`AgentConnection` an `AgentProcess`; the connection gives it a `LineReader`, which gets the
program's stdout a line at a time. This module is all a backend needs of the client.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LineReader:
    """Where an agent's stdout goes (`AgentProcess.read_lines`): `line` is called with each
    line (its newline or not), in order and from one thread at a time, then `end()` once at
    the end of output (or on terminate). A line longer than `limit` bytes is skipped whole
    (never held in memory) and reported by `too_long(its size)`. `line` and `too_long` must
    not block; `end` may."""

    limit: int
    line: Callable[[bytes], None]
    too_long: Callable[[int], None]
    end: Callable[[], None]


class AgentProcess(Protocol):
    """A running agent program, wherever it runs (a local subprocess, a pod exec)."""

    ident: str  # a process id or exec id, for logs and tests
    # Whether `write` may wait for the agent (a pod exec's websocket). A local agent's pipe
    # never does (`sandboxes.pipes.Outbox`): what it cannot take at once waits in memory.
    writes_block: bool

    def write(self, data: bytes) -> None:
        """Write bytes to the agent's stdin (raise OSError once it is gone)."""

    def read_lines(self, reader: LineReader) -> None:
        """Start reading stdout into `reader`."""

    def is_alive(self) -> bool: ...

    def exit_code(self) -> int | None:
        """Return the exit code once known."""

    def stderr_tail(self) -> str:
        """Return the last lines the agent wrote to stderr (for error messages)."""

    def end_reason(self) -> str | None:
        """Return why the agent ended, in words, when the backend knows better than its exit
        code (the kernel killed it for want of memory); else None."""

    def terminate(self, timeout: float = 5.0) -> None:
        """End the program (closing stdin first, then killing) and free its resources."""


class LineTooLong(Exception):
    """The agent wrote a line (one ACP message) longer than Craft takes; it was skipped."""

    def __init__(self, size: int) -> None:
        super().__init__(f"a message of {size} bytes")
        self.size = size


def lines_on_a_thread(readline: Callable[[int], bytes], reader: LineReader, name: str) -> None:
    """`AgentProcess.read_lines` for a process read by blocking `readline(limit)` calls
    (which raise `LineTooLong`): a thread of its own reads it."""

    def read() -> None:
        try:
            while chunk := _next_line(readline, reader.limit, reader.too_long):
                reader.line(chunk)
        except Exception:
            logger.exception("reading from agent %s failed", name)
        finally:
            reader.end()

    threading.Thread(target=read, name=f"acp-reader-{name}", daemon=True).start()


def _next_line(
    readline: Callable[[int], bytes], limit: int, too_long: Callable[[int], None]
) -> bytes:
    while True:
        try:
            return readline(limit)
        except LineTooLong as exc:
            too_long(exc.size)
