"""What Craft keeps of an agent's stderr: bounded lines in the log, and the last few for errors.

Stderr is the one output of an agent that Craft does not parse, and agents are untrusted: read
with an unbounded `readline()`, one 300 MB line took a server from 869 to 2,692 MiB, and 100 MB
of short lines added about 400 MB to its log in 3 s. So `StderrLog` takes the stream in chunks
as they come (from a pipe or an exec websocket), keeps at most `CRAFT_MAX_STDERR_BYTES` of each
line (the rest is counted and dropped, never held), and logs at most
`CRAFT_STDERR_LOG_BYTES_PER_SECOND` of each agent's stderr: a token bucket that holds one
second's worth. Lines past the rate are counted, and one line says how many when logging
resumes and when the stream ends. The last lines, as cut, are kept for error messages whether
or not they were logged.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Iterable

from django.conf import settings

from sandboxes.stderr_text import EARLIER_CUT

agent_stderr = logging.getLogger("craft.agent.stderr")

# How many of the last lines `tail()` returns (error messages quote them): a Python traceback
# of a few chained exceptions, whole.
TAIL_LINES = 60


class StderrLog:
    """One agent's stderr: `feed` it the stream's bytes in order, then `close` it.

    One thread feeds it (the stream's reader); `tail` may be called from any thread.
    """

    def __init__(
        self,
        ident: str,
        *,
        max_line: int | None = None,
        rate: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        redact: Iterable[str] = (),
    ) -> None:
        self.ident = ident
        # Its owner's credentials (docs/agents.md): an agent that prints one to stderr does
        # not put it in Craft's log or an error message. Too short a value would blank out
        # ordinary words, and values are one line, so whole lines are enough to look in.
        self._secrets = sorted({v for v in redact if len(v) >= 4}, key=len, reverse=True)
        self.max_line = settings.CRAFT_MAX_STDERR_BYTES if max_line is None else max_line
        self.rate = settings.CRAFT_STDERR_LOG_BYTES_PER_SECOND if rate is None else rate
        self._clock = clock
        self._line = bytearray()  # the current line, cut to max_line bytes
        self._size = 0  # the current line's length so far, cut or not
        # (the line as kept, its length as written) of the last lines; decoded when quoted.
        self._tail: collections.deque[tuple[bytes, int]] = collections.deque(maxlen=TAIL_LINES)
        self._tokens = float(self.rate)
        self._filled_at = clock()
        self._dropped_lines = 0
        self._dropped_bytes = 0
        self._earlier = False  # lines came before the tail's first one

    def feed(self, data: bytes) -> None:
        """Take the next bytes of the stream; log the lines they complete."""
        view = memoryview(data)
        start = 0
        while start < len(data):
            end = data.find(b"\n", start)
            stop = len(data) if end < 0 else end
            room = self.max_line - len(self._line)
            if room > 0:
                self._line += view[start : min(stop, start + room)]
            self._size += stop - start
            if end < 0:
                return
            self._end_line()
            start = end + 1

    def note(self, text: str) -> None:
        """Add a line of Craft's own (the exec's status, say) to the tail, not to the log."""
        raw = text.encode("utf-8", errors="replace")
        self._earlier = self._earlier or len(self._tail) == self._tail.maxlen
        self._tail.append((raw, len(raw)))

    def tail(self) -> str:
        """Return the last lines, as cut, for an error message; when earlier lines are no
        longer kept, the first line says so (`stderr_text.EARLIER_CUT`), so that what is
        shown never seems to start where the agent's output did."""
        lines = [self._text(raw, size) for raw, size in list(self._tail)]
        return "\n".join([EARLIER_CUT, *lines] if self._earlier else lines)

    def close(self) -> None:
        """End the stream: log its last line if it had no newline, and what was not logged."""
        if self._size:
            self._end_line()
        self._report_dropped()

    def _end_line(self) -> None:
        raw, size = bytes(self._line), self._size
        self._line.clear()
        self._size = 0
        self._earlier = self._earlier or len(self._tail) == self._tail.maxlen
        self._tail.append((raw, size))
        if self.rate and not self._take(len(raw)):
            self._dropped_lines += 1
            self._dropped_bytes += len(raw)
            return
        self._report_dropped()
        agent_stderr.info("[%s] %s", self.ident, self._text(raw, size))

    def _text(self, raw: bytes, size: int) -> str:
        text = _text(raw, size)
        for secret in self._secrets:
            text = text.replace(secret, "[redacted]")
        return text

    def _take(self, size: int) -> bool:
        """Spend `size` bytes of the rate; False when the bucket is empty.

        A line is logged whenever the bucket is not empty, and may take it below zero: a long
        line is paid for by the silence after it, so the rate holds on average.
        """
        now = self._clock()
        refill = (now - self._filled_at) * self.rate
        self._tokens = min(float(self.rate), self._tokens + refill)
        self._filled_at = now
        if self._tokens <= 0:
            return False
        self._tokens -= size
        return True

    def _report_dropped(self) -> None:
        if self._dropped_lines:
            agent_stderr.warning(
                "[%s] %d lines (%d bytes) of stderr were not logged: more than %d bytes a second",
                self.ident, self._dropped_lines, self._dropped_bytes, self.rate,
            )  # fmt: skip
            self._dropped_lines = self._dropped_bytes = 0


def _text(raw: bytes, size: int) -> str:
    text = raw.decode("utf-8", errors="replace")
    return text if size == len(raw) else f"{text} [cut: a line of {size} bytes]"
