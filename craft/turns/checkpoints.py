"""A session's checkpoints: its workspace recorded before its first turn and after its turns.

What is recorded and where is `sandboxes.workspace` (docs/workspace.md); this module decides
when, off the hot path:

* **before a turn**, the previous checkpoint must be written (the next prompt waits only
  for that); a session that has none yet (its first turn, in this or any worker) gets one
  first, which is its state before any turn.
* **after a turn that used tools** (a tool call or a permission request: how an ACP agent
  changes files), a checkpoint is taken in the background once its `turn_end` is stored, and
  the files it changed are stored as one `turn_changes` event. A turn without tools changes
  nothing an agent reports; what an agent changes silently shows in the next checkpoint.

A checkpoint that fails or takes longer than CRAFT_CHECKPOINT_TIMEOUT_SECONDS is skipped, and
the `turn_changes` event says so (`"skipped"`): the turn itself is never held up or failed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from uuid import UUID

from craft.models import Session, Turn
from craft.storage.db import db_sync_to_async
from craft.storage.eventlog import Fenced, Stored
from sandboxes import services as sandbox_services
from sandboxes.backends import SandboxError
from sandboxes.models import Sandbox
from sandboxes.workspace import Checkpoint, Workspace

logger = logging.getLogger(__name__)

# Checkpoints run git in the sandbox: seconds at worst, never on the agent or database threads.
checkpoint_calls = ThreadPoolExecutor(max_workers=8, thread_name_prefix="craft-checkpoint")
# The most files one turn_changes event lists (the diff endpoint has them all).
MAX_FILES = 1000
Append = Callable[[list[tuple[str, dict[str, Any]]]], Awaitable[Stored | None]]


class SessionCheckpoints:
    """The checkpoints of one session, for its runner (all methods run on the event loop)."""

    def __init__(self, session_id: UUID, append: Append) -> None:
        self.session_id = session_id
        self._append = append
        self._last: str | None = None  # the latest checkpoint, once known
        self._writing: asyncio.Task[None] | None = None

    async def before_turn(self, prompt_seq: int) -> None:
        """Wait for the previous checkpoint; make the session's first one if it has none
        (noted as this turn's `checkpoint_before`). A follow-up touches no database here."""
        if self._writing is not None:
            await asyncio.gather(self._writing, return_exceptions=True)
            self._writing = None
        if self._last is None:
            self._last = await _latest(self.session_id)
        if not self._last:
            taken = await self._take(f"session {self.session_id}: before its first turn")
            if isinstance(taken, Checkpoint):
                self._last = taken.commit
                await _note(self.session_id, prompt_seq, checkpoint_before=taken.commit)

    def after_turn(self, prompt_seq: int) -> None:
        """Take the checkpoint of a turn that used tools, in the background."""
        self._writing = asyncio.get_running_loop().create_task(self._after(prompt_seq))

    async def _after(self, prompt_seq: int) -> None:
        try:
            await self._record(prompt_seq)
        except (Session.DoesNotExist, Fenced):
            pass  # the session is gone, or another worker runs it now
        except Exception:
            logger.exception("session %s: recording turn %d's changes failed", self.session_id,
                             prompt_seq)  # fmt: skip

    async def _record(self, prompt_seq: int) -> None:
        before = self._last or ""
        taken = await self._take(f"turn {prompt_seq}")
        if not isinstance(taken, Checkpoint):
            await self._append([("turn_changes", _skipped(prompt_seq, taken))])
            return
        self._last = taken.commit
        await _note(self.session_id, prompt_seq, checkpoint_after=taken.commit)
        try:
            changes = await self._in_workspace(
                lambda workspace: workspace.changes(before, taken.commit, MAX_FILES)
            )
        except SandboxError as exc:
            logger.warning("session %s: the changes of turn %d: %s", self.session_id,
                           prompt_seq, exc)  # fmt: skip
            return
        if changes["files"] or taken.too_large:
            data: dict[str, Any] = {
                "turn": prompt_seq,
                "files": changes["files"],
                "truncated": changes["truncated"],
            }
            if taken.too_large:
                data["left_out"] = taken.too_large
            await self._append([("turn_changes", data)])

    async def _take(self, message: str) -> Checkpoint | str:
        """Take a checkpoint; return it, or why there is none."""
        try:
            return await self._in_workspace(lambda workspace: workspace.checkpoint(message))
        except SandboxError as exc:
            logger.warning("session %s: no checkpoint (%s): %s", self.session_id, message, exc)
            return str(exc)

    async def _in_workspace(self, work: Callable[[Workspace], Any]) -> Any:
        """Run `work` on the session's workspace: found on a database thread (it checks the
        sandbox runs), done on a checkpoint thread (which holds no database connection)."""
        workspace = await _workspace_of(self.session_id)
        return await asyncio.get_running_loop().run_in_executor(checkpoint_calls, work, workspace)


def _skipped(prompt_seq: int, why: str) -> dict[str, Any]:
    return {"turn": prompt_seq, "files": [], "truncated": False, "skipped": why}


@db_sync_to_async
def _latest(session_id: UUID) -> str:
    """The session's latest checkpoint in the database ("" if it never had one)."""
    row = (
        Turn.objects.filter(session_id=session_id)
        .exclude(checkpoint_before="", checkpoint_after="")
        .order_by("-prompt_seq")
        .values_list("checkpoint_before", "checkpoint_after")
        .first()
    )
    if row is None:
        return ""
    before, after = row
    return after or before


@db_sync_to_async
def _note(session_id: UUID, prompt_seq: int, **checkpoint: str) -> None:
    Turn.objects.filter(session_id=session_id, prompt_seq=prompt_seq).update(**checkpoint)


@db_sync_to_async
def _workspace_of(session_id: UUID) -> Workspace:
    sandbox = Sandbox.objects.get(sessions__pk=session_id)
    return sandbox_services.session_workspace(sandbox, session_id)
