"""Every local agent's pipes, served by one thread.

Two threads per agent (a stdout reader and a stderr pump) cost little for a few agents. At
hundreds of agents they are hundreds of threads, each woken for every chunk its agent writes
and each queuing for the GIL behind the event loop and the event writer
(docs/history/performance-diary.md, "One thread for every agent's pipes"). Here one thread
waits on every pipe at once (epoll, through
`selectors`): it hands each output pipe's bytes, in order, to that pipe's reader, and writes
to an agent's stdin what did not fit in the pipe when it was written (`Outbox`).

Readers run on that one thread: they must not block, or every agent waits. So nothing written
to an agent's stdin ever blocks (an agent that stops reading its input would otherwise stop
the thread that reads every agent), and what can take time when a pipe ends (waiting for the
exit code, failing the requests that wait for an answer) is the reader's to move elsewhere.
The thread owns the pipes it serves: it closes each one after its end, and `close()` asks it
to, so that a pipe's number is never reused while the thread still waits on it.
"""

from __future__ import annotations

import logging
import os
import selectors
import threading
from collections.abc import Callable
from typing import IO, Any, NamedTuple

logger = logging.getLogger(__name__)

# One read takes what the pipe holds, up to this: a fast agent's lines come in few reads.
READ_BYTES = 1 << 16


class _Reading(NamedTuple):
    pipe: IO[bytes]
    data: Callable[[bytes], None]
    end: Callable[[], None]


class _Writing(NamedTuple):
    pipe: IO[bytes]
    flush: Callable[[], bool]


class Pipes:
    """Pipes served by one thread, started with the first pipe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._changes: list[tuple[str, IO[bytes], Any]] = []
        self._thread: threading.Thread | None = None
        self._wake_w = -1

    def watch(
        self, pipe: IO[bytes], data: Callable[[bytes], None], end: Callable[[], None]
    ) -> None:
        """Call `data(chunk)` with what `pipe` gives, in order, then `end()` once at its end."""
        self._change("read", pipe, _Reading(pipe, data, end))

    def drain(self, pipe: IO[bytes], flush: Callable[[], bool]) -> None:
        """Call `flush()` whenever `pipe` can take bytes, until it says nothing is left."""
        self._change("write", pipe, _Writing(pipe, flush))

    def close(self, pipe: IO[bytes]) -> None:
        """Stop serving `pipe` and close it; its reader's `end()` is called if not yet."""
        self._change("close", pipe, None)

    def _change(self, what: str, pipe: IO[bytes], watch: Any) -> None:
        with self._lock:
            self._changes.append((what, pipe, watch))
            if self._thread is None:
                selector = selectors.DefaultSelector()
                wake_r, self._wake_w = os.pipe()
                os.set_blocking(wake_r, False)
                os.set_blocking(self._wake_w, False)
                selector.register(wake_r, selectors.EVENT_READ, None)
                self._thread = threading.Thread(
                    target=self._run, args=(selector, wake_r), name="agent-pipes", daemon=True
                )
                self._thread.start()
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:
            pass  # the thread has wake-ups waiting already

    def _run(self, selector: selectors.BaseSelector, wake_r: int) -> None:
        served = selector.get_map()
        while True:
            for key, _ in selector.select():
                if served.get(key.fd) is not key:
                    continue  # closed by a change applied earlier in this round
                try:
                    self._serve(selector, key, wake_r)
                except Exception:
                    # A fault nobody foresaw costs its own pipe, never this thread: every
                    # agent's output goes through it.
                    logger.exception("serving an agent's pipe failed; it is closed")
                    if key.data is not None and served.get(key.fd) is key:
                        _finish(selector, key.data)

    def _serve(
        self, selector: selectors.BaseSelector, key: selectors.SelectorKey, wake: int
    ) -> None:
        watch = key.data
        if watch is None:
            _empty(wake)
            self._apply_changes(selector)
        elif isinstance(watch, _Writing):
            if _call(watch.flush) is not False:
                selector.unregister(watch.pipe)  # nothing left, or it failed
        else:
            try:
                chunk = os.read(key.fd, READ_BYTES)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if chunk:
                _call(watch.data, chunk)
            else:
                _finish(selector, watch)

    def _apply_changes(self, selector: selectors.BaseSelector) -> None:
        with self._lock:
            changes, self._changes = self._changes, []
        for what, pipe, watch in changes:
            try:
                key: selectors.SelectorKey | None = selector.get_key(pipe)
            except (KeyError, ValueError):  # not served (ValueError: closed already)
                key = None
            if what == "close":
                if key is None:
                    _close(pipe)
                else:
                    _finish(selector, key.data)
                continue
            if key is not None:
                if isinstance(watch, _Reading):  # its number is served for another pipe
                    logger.error("pipe %s is served already; not read", key.fd)
                    _call(watch.end)
                continue  # else a write pipe is asked to drain while it drains already
            event = selectors.EVENT_READ if what == "read" else selectors.EVENT_WRITE
            try:
                os.set_blocking(pipe.fileno(), False)
                selector.register(pipe, event, watch)
            except Exception as exc:
                if not isinstance(exc, OSError | ValueError):  # ValueError: closed already
                    logger.exception("serving an agent's pipe failed")
                if isinstance(watch, _Reading):
                    _call(watch.end)


def _finish(selector: selectors.BaseSelector, watch: _Reading | _Writing) -> None:
    selector.unregister(watch.pipe)
    _close(watch.pipe)
    if isinstance(watch, _Reading):
        _call(watch.end)


def _call(action: Callable[..., Any], *args: Any) -> Any:
    try:
        return action(*args)
    except Exception:
        logger.exception("serving an agent's pipe failed")
        return None


def _empty(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def _close(pipe: IO[bytes]) -> None:
    try:
        pipe.close()
    except OSError:
        pass


class Lines:
    """Bytes in, whole lines out (without their newline), in order.

    A line longer than `limit` bytes is never held: it is skipped whole and reported by its
    size (its newline included). What is left at the end without a newline is a last line.
    """

    def __init__(
        self, limit: int, line: Callable[[bytes], None], too_long: Callable[[int], None]
    ) -> None:
        self.limit = limit
        self._line = line
        self._too_long = too_long
        self._parts: list[bytes] = []  # the current line so far, while it fits
        self._size = 0  # the current line's length so far, kept or not

    def feed(self, chunk: bytes) -> None:
        pieces = chunk.split(b"\n")
        rest = pieces.pop()  # after the last newline: the start of a line still coming
        for piece in pieces:
            size = self._size + len(piece)
            if size > self.limit:
                self._too_long(size + 1)
            elif self._parts:
                self._parts.append(piece)
                self._line(b"".join(self._parts))
            else:
                self._line(piece)
            self._parts = []
            self._size = 0
        if rest:
            self._size += len(rest)
            if self._size > self.limit:
                self._parts = []
            else:
                self._parts.append(rest)

    def end(self) -> None:
        if self._size > self.limit:
            self._too_long(self._size)
        elif self._parts:
            self._line(b"".join(self._parts))
        self._parts = []
        self._size = 0


class Outbox:
    """Writes to a pipe that never block the writer.

    What the pipe cannot take at once waits here, in order, and the pipes' thread writes it
    as the reader makes room. More than `limit` bytes waiting means the reader stopped
    reading: the write is refused with an OSError, as a write to a reader that is gone is.
    """

    def __init__(self, pipe: IO[bytes], limit: int, served_by: Pipes) -> None:
        self.limit = limit
        self._pipe = pipe
        self._fd = pipe.fileno()
        os.set_blocking(self._fd, False)
        self._pipes = served_by
        self._lock = threading.Lock()
        self._waiting = bytearray()
        self._sent = 0  # bytes of _waiting written already
        self._error: OSError | None = None

    def write(self, data: bytes) -> None:
        with self._lock:
            if self._error is not None:
                raise OSError(self._error.errno, self._error.strerror)
            if self._waiting:
                if len(self._waiting) - self._sent + len(data) > self.limit:
                    raise OSError(f"the agent read none of the last {self.limit} bytes")
                self._waiting += data
                return
            try:
                written = os.write(self._fd, data)
            except BlockingIOError:
                written = 0
            if written == len(data):
                return
            self._waiting += data[written:]
        self._pipes.drain(self._pipe, self._flush)

    def close(self) -> None:
        """Drop what waits and close the pipe (through the pipes' thread)."""
        with self._lock:
            self._error = self._error or OSError("the pipe is closed")
            self._waiting.clear()
            self._sent = 0
        self._pipes.close(self._pipe)

    def _flush(self) -> bool:
        """Write what waits, as much as the pipe takes; True when nothing is left."""
        with self._lock:
            if not self._waiting:
                return True
            try:
                with memoryview(self._waiting) as waiting:
                    self._sent += os.write(self._fd, waiting[self._sent :])
            except BlockingIOError:
                return False
            except OSError as exc:
                self._error = exc
                self._sent = len(self._waiting)
            if self._sent < len(self._waiting):
                return False
            self._waiting.clear()
            self._sent = 0
            return True


pipes = Pipes()
