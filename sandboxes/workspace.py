"""Craft's one way into a session's workspace: the workspace tool, run where the agent runs.

Each backend starts `workspace_tool.py` (standard library only) with the agent's rights and
hands back its output as a `ToolProcess`; this module speaks the tool's protocol (a JSON
first line, then bytes for a file or an archive) and bounds what it waits for. Craft's own
process never opens a sandbox file by path (invariant 11).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import json
import logging
import queue
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol
from uuid import UUID

from django.conf import settings

from .errors import SandboxError

logger = logging.getLogger(__name__)

TOOL = "workspace_tool.py"
CHUNK = 1 << 16
MAX_HEADER = 64 << 20  # a page of a listing: 10,000 entries are ~1.5 MB
# How long a watching tool that answered is left before its stdin is closed and it exits:
# past the first steps of the turn its answer begins (the prompt sent, the first reply).
WATCH_END_DELAY_SECONDS = 1.0


class ToolProcess(Protocol):
    """The workspace tool running for one request: its stdout, and a way to stop it."""

    def readline(self, limit: int) -> bytes: ...

    def read(self, size: int) -> bytes:
        """Return up to `size` bytes as soon as some are there; b"" at the end."""

    def finish(self, timeout: float) -> int | None:
        """Wait up to `timeout` for the exit code; stop the program if it is not done."""

    def write(self, data: bytes) -> None:
        """Write to the program's stdin (a line is Craft's word to a waiting tool); OSError
        when the program is gone."""

    def close_stdin(self) -> None:
        """Close the program's stdin: a waiting tool takes its end as Craft's word too."""

    def stop(self) -> None:
        """Stop the program now, from any thread (the reader went away, or took too long);
        `finish` still follows."""


class WorkspaceRefused(SandboxError):
    """The tool refused (no such file, a link, too large, ...); `code` is its reason."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


# What a path as Craft spells it never holds: control characters (the tool spells a name's
# as `\xNN`) and lone surrogates (no text from a request or the tool has one). Neither can
# be an argument of the tool: a NUL cannot be in a program's argv at all.
_NEVER_IN_A_PATH = re.compile("[\x00-\x1f\x7f\ud800-\udfff]")


def refuse_bad_path(path: str) -> None:
    """Raise WorkspaceRefused `invalid_path` if `path` holds a control character or a lone
    surrogate."""
    if _NEVER_IN_A_PATH.search(path):
        raise WorkspaceRefused(
            "invalid_path",
            "a path holds no control character (a name with one is spelled \\xNN)",
        )


@dataclass(frozen=True)
class Listing:
    path: str
    total: int
    offset: int
    has_more: bool
    entries: list[dict[str, Any]]
    json: bytes  # the same, as the tool wrote it: an API answers with it as it is


class Download:
    """A file or an archive on its way out: what the tool announced, then its bytes."""

    def __init__(self, header: dict[str, Any], process: ToolProcess) -> None:
        self.header = header
        self._process = process
        self._open = True

    def read(self) -> bytes:
        """Return the next bytes as soon as there are some; b"" at the end."""
        if not self._open:
            return b""
        chunk = self._process.read(CHUNK)
        if not chunk:
            self._open = False
            code = self._process.finish(settings.CRAFT_WORKSPACE_TIMEOUT_SECONDS)
            if code != 0:
                # Raised, not ended quietly: a cut-off zip must not look like a whole one.
                raise SandboxError(f"the download was cut short (the tool ended with {code})")
        return chunk

    def close(self) -> None:
        """Stop the tool if the bytes were not all read (the reader went away)."""
        if self._open:
            self._open = False
            self._process.stop()
            self._process.finish(1.0)


@dataclass(frozen=True)
class Checkpoint:
    """A recorded state of the workspace: a commit of the session's checkpoint store."""

    commit: str
    too_large: list[str]  # files left out for being over CRAFT_CHECKPOINT_MAX_FILE_BYTES
    excluded: list[str]  # the default patterns left out (besides the workspace's .gitignore)
    repositories: list[str]  # folders left out for holding a git repository of their own

    @classmethod
    def of(cls, answer: dict[str, Any]) -> Checkpoint:
        """Read the tool's answer (a tool older than `repositories` names none)."""
        return cls(
            str(answer["commit"]), answer["too_large"], answer["excluded"],
            answer.get("repositories", []),
        )  # fmt: skip


class Workspace:
    """One session's workspace, read through the tool that `run` starts with given arguments.

    `run_in_store` starts it where it may write the session's checkpoint store, `store` (on
    the local backend a jail in which the store is mounted; agents never see it), and
    `run_in_stores` where it may write the stores of all the sandbox's sessions, each in
    the folder `stores` under its session's id (`session` is this one's). `waits`:
    the tool's stdin stays open until `close_stdin`, so a tool can wait for Craft's word
    (`watched_checkpoint`); else it is closed at once and a watch asks git instead.
    """

    def __init__(
        self,
        run: Callable[[list[str]], ToolProcess],
        run_in_store: Callable[[list[str]], ToolProcess] | None = None,
        store: str = "",
        *,
        waits: bool = False,
        run_in_stores: Callable[[list[str]], ToolProcess] | None = None,
        stores: str = "",
        session: str = "",
    ) -> None:
        self._run_tool = run
        self._run_in_store = run_in_store
        self._store = store
        self._waits = waits
        self._run_in_stores = run_in_stores
        self._stores = stores
        self._session = session

    def list_folder(self, path: str, offset: int = 0, limit: int = 1000) -> Listing:
        refuse_bad_path(path)
        answer, line = _answer(
            self._run(["list", path, str(offset), str(limit)]),
            settings.CRAFT_WORKSPACE_TIMEOUT_SECONDS,
        )
        shape = {"path": str, "total": int, "offset": int, "has_more": bool, "entries": list}
        if any(not isinstance(answer.get(key), kind) for key, kind in shape.items()):
            raise SandboxError("the workspace tool answered a listing of the wrong shape")
        return Listing(
            answer["path"], answer["total"], answer["offset"], answer["has_more"],
            answer["entries"], line.strip(),
        )  # fmt: skip

    def read(self, path: str, max_bytes: int) -> Download:
        refuse_bad_path(path)
        return self._download(self._run(["read", path, str(max_bytes)]))

    def write(
        self, path: str, chunks: Iterable[bytes], max_bytes: int, *, overwrite: bool = False
    ) -> dict[str, Any]:
        """Write `chunks` as the file `path` (missing folders made; following no link), in
        place only once all came: `{"path", "size"}`. Raises WorkspaceRefused: `exists`
        (unless `overwrite`), `too_large` (over `max_bytes`: nothing is left), `is_link`,
        `not_a_file`, `invalid_path`, `timeout` (stdin not done within
        CRAFT_WORKSPACE_TIMEOUT_SECONDS of its last chunk)."""
        refuse_bad_path(path)
        return self._fed(["write", path, str(max_bytes), "1" if overwrite else "0"], chunks)

    def _fed(self, args: list[str], chunks: Iterable[bytes]) -> dict[str, Any]:
        """Run the tool with `chunks` on its stdin; return its answer."""
        process = self._started(self._run_tool(args), keep_stdin=True)
        with _Deadline(process, settings.CRAFT_WORKSPACE_TIMEOUT_SECONDS) as deadline:
            for chunk in chunks:
                deadline.renew()
                try:
                    process.write(chunk)
                except OSError:
                    break  # it answered already: a refusal, read below
            with contextlib.suppress(OSError):
                process.close_stdin()
            return _header_line(process)[0]

    def fork_from(self, source: UUID, commit: str, max_bytes: int) -> dict[str, Any]:
        """Start this new session's workspace and checkpoints from checkpoint `commit` of
        session `source`, of the same sandbox: its store becomes a copy of the source's (every
        checkpoint of the source is one of its own, under the same commit id), and its empty
        workspace gets the files of `commit`: `{"files", "bytes"}`. Raises WorkspaceRefused:
        `not_empty`, `too_large` (over `max_bytes`), `no_checkpoint`, `timeout` (past
        CRAFT_CHECKPOINT_TIMEOUT_SECONDS)."""
        if self._run_in_stores is None:
            raise SandboxError("this backend keeps no checkpoints")
        store, theirs = f"{self._stores}/{self._session}", f"{self._stores}/{UUID(str(source))}"
        process = self._started(
            self._run_in_stores(["fork", store, theirs, commit, str(max_bytes)]), keep_stdin=False
        )
        return _answer(process, settings.CRAFT_CHECKPOINT_TIMEOUT_SECONDS)[0]

    def archive(self, max_bytes: int) -> Download:
        return self._download(self._run(["archive", str(max_bytes)]))

    def checkpoint(self, message: str) -> Checkpoint:
        """Record the workspace now (git add and commit); raise WorkspaceRefused with code
        `timeout` when that takes longer than CRAFT_CHECKPOINT_TIMEOUT_SECONDS."""
        limit = str(settings.CRAFT_CHECKPOINT_MAX_FILE_BYTES)
        answer, _ = _answer(
            self._in_store(["checkpoint", self._store, limit, message]),
            settings.CRAFT_CHECKPOINT_TIMEOUT_SECONDS,
        )
        return Checkpoint.of(answer)

    def watched_checkpoint(self, message: str, seconds: float) -> tuple[Checkpoint, Watch]:
        """Record the workspace now, and keep watching it for up to `seconds`: the Watch then
        says, at once when nothing changed, whether it is still as recorded."""
        if not self._waits:
            taken = self.checkpoint(message)
            return taken, Watch(self, taken.commit, None)
        limit = str(settings.CRAFT_CHECKPOINT_MAX_FILE_BYTES)
        args = ["checkpoint-watch", self._store, limit, message, f"{seconds:g}"]
        process = self._in_store(args, keep_stdin=True)
        timeout = settings.CRAFT_CHECKPOINT_TIMEOUT_SECONDS
        watchdog = alarms.after(timeout, process.stop)
        try:
            answer, _ = _header_line(process)
        except BaseException as exc:
            process.stop()
            process.finish(1.0)
            if isinstance(exc, SandboxError) and watchdog.rang:
                raise WorkspaceRefused("timeout", f"took longer than {timeout:g} s") from None
            raise
        finally:
            watchdog.cancel()
        taken = Checkpoint.of(answer)
        return taken, Watch(self, taken.commit, process)

    def unchanged(self, commit: str) -> bool:
        """Say whether the workspace is still as checkpoint `commit` recorded it (a checkpoint
        taken now would record the same); false when in doubt. Cheaper than a checkpoint: no
        commit, one git process."""
        limit = str(settings.CRAFT_CHECKPOINT_MAX_FILE_BYTES)
        answer, _ = _answer(
            self._in_store(["unchanged", self._store, commit, limit]),
            settings.CRAFT_CHECKPOINT_TIMEOUT_SECONDS,
        )
        return answer.get("unchanged") is True

    def changes(self, before: str, after: str, limit: int = 1000) -> dict[str, Any]:
        """The files that differ between two checkpoints ("" before: none):
        `{"files": [{"path", "status", "old_path"?, "added", "removed", "binary"}],
        "truncated"}`."""
        process = self._in_store(["changes", self._store, before, after, str(limit)])
        return _answer(process, settings.CRAFT_WORKSPACE_TIMEOUT_SECONDS)[0]

    def diff(self, before: str, after: str, path: str = "") -> Download:
        """The unified diff between two checkpoints, of one path if given, streamed."""
        refuse_bad_path(path)
        return self._download(self._in_store(["diff", self._store, before, after, path]))

    def revert(self, before: str, after: str, path: str = "", hunk: int | None = None) -> None:
        """Put the workspace back as it was in checkpoint `before`: all of it, one file (with
        its old name if `after` renamed it), or hunk number `hunk` of that file's diff from
        `before` to `after`. Take a checkpoint just before (the tool restores from the store's
        index) and one after (the revert is a checkpoint). Raises WorkspaceRefused: `conflict`
        when the hunk no longer applies, `no_such_hunk`, `invalid_path`."""
        refuse_bad_path(path)
        hunk_arg = "" if hunk is None else str(hunk)
        process = self._in_store(["revert", self._store, before, after, path, hunk_arg])
        _answer(process, settings.CRAFT_CHECKPOINT_TIMEOUT_SECONDS)

    def _run(self, args: list[str]) -> ToolProcess:
        return self._started(self._run_tool(args), keep_stdin=False)

    def _in_store(self, args: list[str], keep_stdin: bool = False) -> ToolProcess:
        if self._run_in_store is None:
            raise SandboxError("this backend keeps no checkpoints")
        return self._started(self._run_in_store(args), keep_stdin)

    def _started(self, process: ToolProcess, keep_stdin: bool) -> ToolProcess:
        if self._waits and not keep_stdin:
            process.close_stdin()  # nothing to say to it
        return process

    def _download(self, process: ToolProcess) -> Download:
        try:
            return Download(_header(process), process)
        except BaseException:
            process.stop()
            process.finish(1.0)
            raise


class Watch:
    """A checkpoint's workspace, watched by its tool since just before it was recorded."""

    def __init__(self, workspace: Workspace, commit: str, process: ToolProcess | None) -> None:
        self.commit = commit
        self._workspace = workspace
        self._process = process

    def still(self) -> bool:
        """Say, once, whether the workspace is still as the checkpoint recorded it (as
        `Workspace.unchanged`; false when in doubt): the watching tool answers at once when it
        heard nothing; when it was not watching, or stopped, git is asked."""
        process, self._process = self._process, None
        if process is not None:
            timeout = settings.CRAFT_CHECKPOINT_TIMEOUT_SECONDS
            watchdog = alarms.after(timeout, process.stop)
            try:
                process.write(b"\n")
                answer, _ = _header_line(process)
            except (SandboxError, OSError) as exc:  # its time ran out, or it was stopped
                logger.info("the workspace watch gave no answer: %s", exc)
            else:
                return answer.get("unchanged") is True
            finally:
                watchdog.cancel()
                # The tool exits when its stdin ends, and its exit tears down its jail: tens
                # of milliseconds of the machine's time, which the turn this answer begins
                # should not spend. It ends a moment later, off that turn's first steps.
                alarms.after(WATCH_END_DELAY_SECONDS, partial(reaper.finish, process, timeout))
        return self._workspace.unchanged(self.commit)

    def close(self) -> None:
        """Stop watching (nobody will ask)."""
        process, self._process = self._process, None
        if process is not None:
            process.stop()
            process.finish(1.0)


def _answer(process: ToolProcess, timeout: float) -> tuple[dict[str, Any], bytes]:
    """Read a one-line answer within `timeout` seconds (the tool is stopped past it); return
    it parsed and as it came."""
    with _Deadline(process, timeout):
        return _header_line(process)


class _Deadline:
    """A run of the tool stopped once `timeout` seconds pass (counted again from each
    `renew`). As a context: finish the run on the way out, and turn a SandboxError that the
    stop caused into WorkspaceRefused `timeout`."""

    def __init__(self, process: ToolProcess, timeout: float) -> None:
        self._process = process
        self._timeout = timeout
        self._watchdog = alarms.after(timeout, process.stop)

    def renew(self) -> None:
        self._watchdog.cancel()
        self._watchdog = alarms.after(self._timeout, self._process.stop)

    def __enter__(self) -> _Deadline:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, _: object
    ) -> None:
        self._watchdog.cancel()
        self._process.finish(1.0)
        if isinstance(exc, SandboxError) and self._watchdog.rang:
            raise WorkspaceRefused("timeout", f"took longer than {self._timeout:g} s") from None


def _header(process: ToolProcess) -> dict[str, Any]:
    return _header_line(process)[0]


def _header_line(process: ToolProcess) -> tuple[dict[str, Any], bytes]:
    """Read the tool's first line: its answer, or its refusal raised as WorkspaceRefused."""
    line = process.readline(MAX_HEADER)
    try:
        answer = json.loads(line)
    except ValueError:
        code = process.finish(1.0)
        raise SandboxError(
            f"the workspace tool gave no answer (exit code {code}); see the server log"
        ) from None
    if not isinstance(answer, dict):
        raise SandboxError("the workspace tool answered nonsense")
    error = answer.get("error")
    if isinstance(error, dict):
        raise WorkspaceRefused(str(error.get("code")), str(error.get("message")))
    return answer, line


# --- waiting in the background ----------------------------------------------------------------
# A thread started per request (threading.Timer, a thread to reap the tool) waits for the GIL
# before `start` returns: up to milliseconds on the caller's path while the event loop is
# busy. These two threads are started once.


class Alarm:
    """An action due at a time unless cancelled first (see `Alarms`)."""

    def __init__(self, action: Callable[[], None]) -> None:
        self._action = action
        self.cancelled = False
        self.rang = False  # the action ran

    def cancel(self) -> None:
        self.cancelled = True

    def _ring(self) -> None:
        if self.cancelled:
            return
        self.rang = True
        try:
            self._action()
        except Exception:
            logger.exception("a workspace watchdog failed")


class Alarms:
    """Alarms of every request, rung by one thread (`threading.Timer` without a thread each)."""

    def __init__(self) -> None:
        self._due: list[tuple[float, int, Alarm]] = []
        self._order = itertools.count()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def after(self, seconds: float, action: Callable[[], None]) -> Alarm:
        alarm = Alarm(action)
        with self._changed:
            heapq.heappush(self._due, (time.monotonic() + seconds, next(self._order), alarm))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="workspace-alarms", daemon=True
                )
                self._thread.start()
            elif self._due[0][2] is alarm:
                self._changed.notify()  # due before the one the thread waits for
        return alarm

    def _run(self) -> None:
        while True:
            with self._changed:
                while True:
                    while self._due and self._due[0][2].cancelled:
                        heapq.heappop(self._due)  # cancelled ones leave when they come up
                    left = self._due[0][0] - time.monotonic() if self._due else None
                    if left is not None and left <= 0:
                        alarm = heapq.heappop(self._due)[2]
                        break
                    self._changed.wait(left)
            alarm._ring()


class Reaper:
    """Tools whose answer is in, reaped in turn (their exit waited for) by one thread."""

    def __init__(self) -> None:
        self._tools: queue.SimpleQueue[tuple[ToolProcess, float]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def finish(self, process: ToolProcess, timeout: float) -> None:
        """End `process` (its stdin closed), waiting up to `timeout` for its exit."""
        self._tools.put((process, timeout))
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="workspace-reaper", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        while True:
            process, timeout = self._tools.get()
            try:
                process.close_stdin()
                process.finish(timeout)
            except Exception:
                logger.exception("reaping a workspace tool failed")


alarms = Alarms()
reaper = Reaper()
