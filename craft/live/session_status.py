"""What a session socket shows of its person besides the session's events: their sandbox,
their list of sessions, what the session's quiet agent last wrote to stderr.

The notices come from `craft.live.status` (this process's directly, other processes' through
the channel layer); a socket folds a burst into one read of the sandbox (a `sandbox` frame,
when it changed), one `sessions` frame, and one `agent_stderr` frame (when it differs from
the last one sent), and sends nothing of it before its `hello`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any
from uuid import UUID

from craft.live import delivery, status
from craft.storage.db import db_sync_to_async
from sandboxes.models import Sandbox

logger = logging.getLogger(__name__)

# A `sessions` frame names at most this many changed sessions; past it, none (read them all).
CHANGED_SESSIONS_AT_MOST = 20


def with_changed(changed: set[str] | None, first: bool, session: Any) -> set[str] | None:
    """Return the sessions the next `sessions` frame names once `session` changed (`first`:
    the first change since the last frame): past `CHANGED_SESSIONS_AT_MOST`, or with one not
    named, None: the frame names none and the page reads its whole list."""
    if first:
        changed = set()
    full = changed is not None and len(changed) >= CHANGED_SESSIONS_AT_MOST
    if changed is None or not isinstance(session, str) or (full and session not in changed):
        return None
    changed.add(session)
    return changed


def sessions_frame(changed: set[str] | None) -> dict[str, Any]:
    """Return the `sessions` frame that names the `changed` sessions (all, if None)."""
    frame: dict[str, Any] = {"type": "sessions"}
    if changed is not None:
        frame["sessions"] = sorted(changed)
    return frame


@db_sync_to_async
def _sandbox_state(session_id: UUID) -> dict[str, str] | None:
    """The state of the session's sandbox now (a session whose sandbox was terminated moves
    to its owner's new one at its next prompt: the frames follow it)."""
    sandbox = Sandbox.objects.filter(sessions__pk=session_id).first()
    return None if sandbox is None else status.sandbox_state(sandbox)


class FollowsStatus:
    """Consumer mixin: the person's status on a session socket (a `craft.live.status`
    Listener). The socket sets `_sandbox_sent` and `_hello_sent` with its `hello`, and starts
    `_start_status` after it if anything is stale by then."""

    session_id: UUID
    _status_task: asyncio.Task[None] | None = None
    _sandbox_stale = False
    _sessions_stale = False
    # The sessions that changed since the last `sessions` frame; None: not known which.
    _changed_sessions: set[str] | None = None
    _follows_sessions = False  # until the client sends `follow_sessions`
    _sessions_missed = False  # a sessions notice came before `follow_sessions`
    _hello_sent = False  # no status frame before the `hello`
    _sandbox_sent: dict[str, str] | None = None
    # What this session's quiet agent last wrote to stderr: to send, sent.
    _stderr_said: str | None = None
    _stderr_sent = ""

    if TYPE_CHECKING:

        async def send_json(self, content: dict[str, Any]) -> None: ...

        def scrubbed(self, text: str) -> str: ...

    def notice(self, message: dict[str, Any]) -> None:
        """Take a status notice (on the event loop) and send what it changed, once."""
        if message.get("type") == status.AGENT_STDERR:
            if message.get("session") != self.session_id.hex or not self._hello_sent:
                return  # another session's agent; or a line a later one replaces anyway
            text = message.get("text")
            self._stderr_said = text if isinstance(text, str) else ""
            self._start_status()
            return
        if message.get("type") == status.SANDBOX_CHANGED:
            self._sandbox_stale = True  # of this session's, or the one it is moving to
        elif self._follows_sessions:
            self._changed_sessions = with_changed(
                self._changed_sessions, not self._sessions_stale, message.get("session")
            )
            self._sessions_stale = True
        else:
            self._sessions_missed = True
            return
        if self._hello_sent:
            self._start_status()  # else the hello starts it, after itself

    def follow_sessions(self) -> None:
        """Send a `sessions` frame from now on when a session of the person's changes."""
        self._follows_sessions = True
        if self._sessions_missed:
            # A change since this socket listened (its connect), before it followed: the
            # list the page holds may not show it. One frame now, as if it had followed.
            self.notice({"type": status.SESSIONS_CHANGED})

    def stop_status(self) -> None:
        if self._status_task is not None:
            self._status_task.cancel()

    def _start_status(self) -> None:
        if self._status_task is None or self._status_task.done():
            self._status_task = asyncio.get_running_loop().create_task(self._send_status())

    async def _send_status(self) -> None:
        try:
            while self._sandbox_stale or self._sessions_stale or self._stderr_said is not None:
                if self._stderr_said is not None:
                    text, self._stderr_said = self.scrubbed(self._stderr_said), None
                    if text != self._stderr_sent:
                        self._stderr_sent = text
                        await self.send_json({"type": "agent_stderr", "text": text})
                if self._sandbox_stale:
                    self._sandbox_stale = False
                    state = await _sandbox_state(self.session_id)
                    if state is not None:
                        state["error"] = self.scrubbed(state["error"])
                    if state is not None and state != self._sandbox_sent:
                        self._sandbox_sent = state
                        await self.send_json({"type": "sandbox", **state})
                if self._sessions_stale:
                    self._sessions_stale = False
                    await self.send_json(sessions_frame(self._changed_sessions))
        except Exception:
            logger.exception("session %s: sending the status failed", self.session_id)

    async def sandbox_changed(self, message: dict[str, Any]) -> None:
        """Another process changed one of the person's sandboxes (the layer's notice)."""
        if message.get("origin") != delivery.PROCESS_ID:
            self.notice(message)

    async def sessions_changed(self, message: dict[str, Any]) -> None:
        """Another process changed one of the person's sessions (the layer's notice)."""
        if message.get("origin") != delivery.PROCESS_ID:
            self.notice(message)

    async def agent_stderr(self, message: dict[str, Any]) -> None:
        """A quiet agent run by another process wrote to stderr (the layer's notice)."""
        if message.get("origin") != delivery.PROCESS_ID:
            self.notice(message)
