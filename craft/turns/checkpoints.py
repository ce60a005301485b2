"""A session's checkpoints: its workspace recorded before its first turn and after its turns.

What is recorded and where is `sandboxes.workspace` (docs/workspace.md); this module decides
when, off the hot path:

* **before a turn**, the previous checkpoint must be written (the next prompt waits only
  for that); a session that has none yet (its first turn, in this or any worker) gets one
  first, which is its state before any turn.
* **ahead of a session's first prompt** (its agent started early, `start_agent`), that first
  checkpoint is taken in the background (`take_first_early`). It is only a candidate: once
  the first prompt comes (asked beside storing it, `confirm_first`), the workspace is asked
  whether it is still that state, and the first turn takes a new one if not, or if in doubt.
  The tool that took it keeps watching the workspace (`Workspace.watched_checkpoint`) and
  answers at once when nothing changed; else git decides (`Workspace.unchanged`). So
  whatever was written in between (by the agent, or anything else in the sandbox) is in the
  first turn's "before" state, never counted as the turn's change. The first checkpoint is
  noted on the turn beside it, not before it.
* **after a turn that used tools** (a tool call or a permission request: how an ACP agent
  changes files), a checkpoint is taken in the background once its `turn_end` is stored, and
  the files it changed are stored as one `turn_changes` event. A turn without tools changes
  nothing an agent reports; what an agent changes silently shows in the next checkpoint.

A revert (`revert`) is a change of its own: the workspace is recorded, put back as it was
before a turn (or a revert), recorded again, and stored as a `workspace_reverted` event with
the files it changed. Its checkpoints are kept (`WorkspaceRevert`, stored in the event's
transaction) so that it can be reverted in turn.

A checkpoint that fails or takes longer than CRAFT_CHECKPOINT_TIMEOUT_SECONDS is skipped, and
the `turn_changes` event says so (`"skipped"`): the turn itself is never held up or failed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any
from uuid import UUID

from django.db import transaction

from craft.errors import Refused
from craft.models import Session, TurnRecord, WorkspaceRevert
from craft.storage.db import db_sync_to_async
from craft.storage.eventlog import Fence, Fenced, Stored, append_events, turn_rows
from sandboxes import services as sandbox_services
from sandboxes.backends import SandboxError
from sandboxes.models import Sandbox
from sandboxes.workspace import Checkpoint, Watch, Workspace, WorkspaceRefused

logger = logging.getLogger(__name__)

# Checkpoints run git in the sandbox: seconds at worst, never on the agent or database threads.
checkpoint_calls = ThreadPoolExecutor(max_workers=8, thread_name_prefix="craft-checkpoint")
# The most files one turn_changes event lists (the diff endpoint has them all).
MAX_FILES = 1000
# How long the early first checkpoint's tool watches the workspace for the first prompt
# (an idle agent is stopped after CRAFT_AGENT_IDLE_SECONDS, 900 by default); a later first
# prompt confirms the checkpoint with git alone.
EARLY_WATCH_SECONDS = 900.0
Append = Callable[[list[tuple[str, dict[str, Any]]]], Awaitable[Stored | None]]
# The early first checkpoint (or why there is none; None: the session has one) and its watch.
Early = tuple[Checkpoint | str | None, Watch | None]


class SessionCheckpoints:
    """The checkpoints of one session, for its runner (all methods run on the event loop)."""

    def __init__(self, session_id: UUID, append: Append) -> None:
        self.session_id = session_id
        self._append = append
        self._last: str | None = None  # the latest checkpoint, once known
        self._writing: asyncio.Task[None] | None = None
        # The first checkpoint taken ahead of the first prompt (None: the session had one)
        # with the watch of the workspace since, and its confirmation once a prompt came.
        self._early: asyncio.Task[Early] | None = None
        self._confirming: asyncio.Task[Checkpoint | None] | None = None
        self._unused: asyncio.Task[Checkpoint | None] | None = None
        self._known = 0  # counts what `forget` forgot: a read older than that is stale
        self._dropped = False  # see `drop`

    def forget(self) -> None:
        """Forget the latest checkpoint: another worker may have taken one meanwhile (the
        runner's lease changed); the next turn reads it from the store."""
        self._last = None
        self._known += 1

    def take_first_early(self) -> None:
        """Take the session's first checkpoint now, in the background, if it may have none
        (its agent just started, so its workspace exists); the first turn confirms it."""
        writing = self._writing is not None and not self._writing.done()
        if self._last or self._early is not None or self._confirming is not None or writing:
            return
        self._early = asyncio.get_running_loop().create_task(self._take_early())

    async def take_first(self) -> None:
        """Take the session's first checkpoint now (as `take_first_early`) and wait for it:
        its repository was just cloned and set up, and its first prompt should not wait for
        a checkpoint of every file of the clone."""
        self.take_first_early()
        if self._early is not None:
            await asyncio.shield(self._early)

    async def _take_early(self) -> Early:
        """Return the early checkpoint and its watch, or why there is none (None: the session
        has one). Never raises: nobody may ever wait for it (no prompt comes)."""
        try:
            known = self._known
            if await db_sync_to_async(latest_checkpoint)(self.session_id):
                return None, None  # not the session's first: a turn (of any worker) took one
            if self._last is None and known == self._known:
                self._last = ""  # known to be none: the first prompt need not read it again
            message = f"session {self.session_id}: before its first turn"
            taken, watch = await self._watched(message)
            if self._dropped:
                await asyncio.get_running_loop().run_in_executor(checkpoint_calls, watch.close)
                return taken, None
            return taken, watch
        except Exception as exc:  # the session or its sandbox is gone: a turn takes one
            logger.info("session %s: no early checkpoint: %s", self.session_id, exc)
            return str(exc), None

    def confirm_first(self) -> None:
        """Ask now whether the workspace is still as the early first checkpoint recorded it:
        a prompt that begins the session's first turn is being stored, and its turn takes the
        answer (`before_turn`). Without an early checkpoint, nothing."""
        if not self._last and self._early is not None and self._confirming is None:
            early, self._early = self._early, None
            self._confirming = asyncio.get_running_loop().create_task(self._confirmed_early(early))

    def confirmation_unused(self) -> None:
        """The prompt `confirm_first` was asked for was not stored: its answer says nothing
        of a later prompt, whose turn takes a new first checkpoint."""
        self._unused, self._confirming = self._confirming, None  # kept while it runs

    async def before_turn(self, prompt_seq: int) -> None:
        """Wait for the previous checkpoint; make the session's first one if it has none
        (noted as this turn's `checkpoint_before`): the one taken ahead of the prompt if the
        workspace is still as it recorded, else a new one. A follow-up touches no database
        here."""
        await self.settle()
        if self._last and (self._early is not None or self._confirming is not None):
            await self.close()  # another worker's turn took the first one meanwhile
        if not self._last:
            self.confirm_first()
            taken: Checkpoint | str | None = None
            confirming = self._confirming
            if confirming is not None:
                # Shielded, and forgotten only once done: a turn stopped meanwhile leaves it
                # to the next one, which then never writes the store while it is being
                # written.
                taken = await asyncio.shield(confirming)
                self._confirming = None
            if taken is None:
                taken = await self._take(f"session {self.session_id}: before its first turn")
            if isinstance(taken, Checkpoint):
                self._last = taken.commit
                # Noted beside the turn, not before it: the next prompt, a revert and this
                # turn's own checkpoint wait for it (`settle`, `_after`).
                self._writing = asyncio.get_running_loop().create_task(
                    self._note_first(prompt_seq, taken.commit)
                )

    async def _confirmed_early(self, early: asyncio.Task[Early]) -> Checkpoint | None:
        """Return the checkpoint taken ahead of the first prompt (waiting while it is being
        written) if the workspace is still as it recorded; None if there is none or it is
        stale, failed, or cannot be confirmed."""
        taken, watch = await early
        if not isinstance(taken, Checkpoint) or watch is None:
            return None
        try:
            still = await asyncio.get_running_loop().run_in_executor(checkpoint_calls, watch.still)
        except SandboxError as exc:
            logger.info("session %s: the early checkpoint is not confirmed: %s",
                        self.session_id, exc)  # fmt: skip
            return None
        return taken if still else None

    def drop(self) -> None:
        """Stop the early checkpoint's watch at once, from any thread: the runner is being
        dropped (its session deleted), and nobody will ask the watch. A watch still being
        started is stopped by its own task when it comes."""
        self._dropped = True
        early, self._early = self._early, None
        if early is not None and early.done() and not early.cancelled():
            _, watch = early.result()
            if watch is not None:
                watch.close()

    async def close(self) -> None:
        """Forget the early checkpoint and stop its watch (this worker no longer runs the
        session, or another turn took the first checkpoint)."""
        early, self._early = self._early, None
        confirming, self._confirming = self._confirming, None
        if confirming is not None:
            await asyncio.gather(asyncio.shield(confirming), return_exceptions=True)
        if early is not None:
            _, watch = await asyncio.shield(early)  # never raises
            if watch is not None:
                await asyncio.get_running_loop().run_in_executor(checkpoint_calls, watch.close)

    async def settle(self) -> None:
        """Wait for the checkpoint being written (a prompt waits before it is stored, so that
        the previous turn's `turn_changes` comes before it); know the latest one."""
        if self._writing is not None:
            await asyncio.gather(self._writing, return_exceptions=True)
            self._writing = None
        if self._last is None:
            self._last = await db_sync_to_async(latest_checkpoint)(self.session_id)

    async def revert(
        self, seq: int, path: str = "", hunk: int | None = None, *, fence: Fence | None = None
    ) -> None:
        """Put the workspace back as it was before change `seq` (a turn, or a revert): all of
        it, one file, or one hunk of one file; store it as a `workspace_reverted` event (under
        the runner's `fence`). The runner calls it only between turns. Raises Refused saying
        why not (`nothing_to_revert` when the files are already so: nothing is stored)."""
        await self.settle()
        known = self._last  # the latest checkpoint the log knows
        before, after = await db_sync_to_async(checkpoints_of)(self.session_id, seq)
        if not before or (path and not after):
            raise Refused("no_checkpoint", "there is no checkpoint of the files around that turn")

        def revert(workspace: Workspace) -> tuple[Checkpoint, Checkpoint, dict[str, Any]]:
            what = (
                f"turn {seq}"
                + (f", {path}" if path else "")
                + (f", hunk {hunk}" if hunk is not None else "")
            )
            current = workspace.checkpoint(f"before reverting {what}")
            workspace.revert(before, after, path, hunk)
            reverted = workspace.checkpoint(f"revert of {what}")
            changes = workspace.changes(current.commit, reverted.commit, MAX_FILES)
            if not changes["files"] and known and known != current.commit:
                # The files were already so, but the log may not know it (a revert whose
                # event could not be stored): what changed since the checkpoint it knows.
                changes = workspace.changes(known, reverted.commit, MAX_FILES)
            return current, reverted, changes

        try:
            current, reverted, changes = await self._in_workspace(revert)
        except WorkspaceRefused as exc:
            raise Refused(exc.code, str(exc)) from None
        except SandboxError as exc:
            raise Refused(
                "workspace_unavailable", f"the workspace cannot be reverted: {exc}"
            ) from None
        finally:
            self._last = None  # whatever happened, the store says which is the latest
        if not changes["files"]:
            # Already as it was (reverted before, say): no event, so no "0 files changed".
            self._last = reverted.commit
            raise Refused(
                "nothing_to_revert", "the files are already as they were before that change"
            )
        data: dict[str, Any] = {"turn": seq, "files": changes["files"],
                                "truncated": changes["truncated"]}  # fmt: skip
        if path:
            data["path"] = path
        if hunk is not None:
            data["hunk"] = hunk
        await _store_revert(self.session_id, data, current.commit, reverted.commit, fence)
        self._last = reverted.commit

    def after_turn(self, prompt_seq: int) -> None:
        """Take the checkpoint of a turn that used tools, in the background."""
        self._writing = asyncio.get_running_loop().create_task(
            self._after(prompt_seq, self._writing)
        )

    async def _note_first(self, prompt_seq: int, commit: str) -> None:
        try:
            await _note(self.session_id, prompt_seq, checkpoint_before=commit)
        except Exception:
            logger.exception("session %s: noting the first checkpoint failed", self.session_id)

    async def _after(self, prompt_seq: int, noting: asyncio.Task[None] | None) -> None:
        if noting is not None:
            await asyncio.gather(noting, return_exceptions=True)
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

    async def _watched(self, message: str) -> tuple[Checkpoint, Watch]:
        """Take a checkpoint and keep its tool watching the workspace. Cancelled (its event
        loop is closing) while the tool starts, the thread that starts it stops it: nobody
        else would, and it would watch for EARLY_WATCH_SECONDS."""
        workspace = await _workspace_of(self.session_id)
        call = checkpoint_calls.submit(workspace.watched_checkpoint, message, EARLY_WATCH_SECONDS)
        try:
            return await asyncio.wrap_future(call)
        except asyncio.CancelledError:
            call.add_done_callback(_stop_watch)  # run by that thread, loop or no loop
            raise

    async def _in_workspace(self, work: Callable[[Workspace], Any]) -> Any:
        """Run `work` on the session's workspace: found on a database thread (it checks the
        sandbox runs), done on a checkpoint thread (which holds no database connection)."""
        workspace = await _workspace_of(self.session_id)
        return await asyncio.get_running_loop().run_in_executor(checkpoint_calls, work, workspace)


def _stop_watch(call: Future[tuple[Checkpoint, Watch]]) -> None:
    if not call.cancelled() and call.exception() is None:
        call.result()[1].close()


def _skipped(prompt_seq: int, why: str) -> dict[str, Any]:
    return {"turn": prompt_seq, "files": [], "truncated": False, "skipped": why}


def latest_checkpoint(session_id: UUID, before: int | None = None) -> str:
    """The session's latest checkpoint ("" if none): of all, or the latest taken before the
    change at seq `before` (a turn, by its user_message's seq, or a revert).

    A turn's checkpoints are the one before it (a session's first turn only) and the one
    after it; a revert's, the one after it.
    """
    limit = 2**63 - 1 if before is None else before
    found: list[tuple[int, int, str]] = []  # (seq, 0 before / 1 after, commit)
    turns = (
        TurnRecord.objects.filter(session_id=session_id, prompt_seq__lte=limit)
        .exclude(checkpoint_before="", checkpoint_after="")
        .order_by("-prompt_seq")
        .values_list("prompt_seq", "checkpoint_before", "checkpoint_after")
    )
    for prompt_seq, checkpoint_before, checkpoint_after in turns[:2]:
        if prompt_seq < limit and checkpoint_after:
            found.append((prompt_seq, 1, checkpoint_after))
        elif checkpoint_before:
            found.append((prompt_seq, 0, checkpoint_before))
        if found:
            break
    revert = (
        WorkspaceRevert.objects.filter(session_id=session_id, seq__lt=limit)
        .order_by("-seq")
        .values_list("seq", "checkpoint_after")
        .first()
    )
    if revert is not None:
        found.append((revert[0], 1, revert[1]))
    return max(found)[2] if found else ""


def latest_checkpoints(session_id: UUID, befores: list[int | None]) -> list[str]:
    """Return `latest_checkpoint(session_id, before=each)` for each of `befores`, reading
    the session's checkpoints once (a fork asks it for every turn it copies)."""
    # (its place: (seq, 0 before / 1 after), as there; the least `before` it answers; commit)
    found: list[tuple[tuple[int, int], int, str]] = []
    turns = (
        TurnRecord.objects.filter(session_id=session_id)
        .exclude(checkpoint_before="", checkpoint_after="")
        .values_list("prompt_seq", "checkpoint_before", "checkpoint_after")
    )
    for prompt_seq, checkpoint_before, checkpoint_after in turns:
        if checkpoint_before:
            found.append(((prompt_seq, 0), prompt_seq, checkpoint_before))
        if checkpoint_after:
            found.append(((prompt_seq, 1), prompt_seq + 1, checkpoint_after))
    reverts = WorkspaceRevert.objects.filter(session_id=session_id)
    for seq, checkpoint_after in reverts.values_list("seq", "checkpoint_after"):
        found.append(((seq, 1), seq + 1, checkpoint_after))
    found.sort(reverse=True)  # the latest first
    limits = [2**63 - 1 if before is None else before for before in befores]
    return [next((commit for _, least, commit in found if least <= limit), "") for limit in limits]


def checkpoints_of(session_id: UUID, seq: int) -> tuple[str, str]:
    """Return the checkpoints (before, after) around the change at `seq`, a turn (its
    user_message's seq) or a revert (its workspace_reverted event's seq); "" where none."""
    revert = (
        WorkspaceRevert.objects.filter(session_id=session_id, seq=seq)
        .values_list("checkpoint_before", "checkpoint_after")
        .first()
    )
    if revert is not None:
        return revert
    turn = TurnRecord.objects.filter(session_id=session_id, prompt_seq=seq)
    after = turn.values_list("checkpoint_after", flat=True).first()
    if after is None:
        return "", ""  # no such turn
    return latest_checkpoint(session_id, before=seq), after


@db_sync_to_async
def _store_revert(
    session_id: UUID, data: dict[str, Any], before: str, after: str, fence: Fence | None
) -> None:
    """Store a revert's event and its checkpoints in one transaction: an event whose revert
    cannot be looked at or reverted in turn is never stored."""
    with transaction.atomic():
        stored = append_events(session_id, [("workspace_reverted", data)], fence=fence)
        if stored is not None:
            WorkspaceRevert.objects.create(
                session_id=session_id, seq=stored.first_seq,
                checkpoint_before=before, checkpoint_after=after,
            )  # fmt: skip


@db_sync_to_async
def _note(session_id: UUID, prompt_seq: int, **checkpoint: str) -> None:
    turn_rows.note_checkpoints(session_id, prompt_seq, **checkpoint)


@db_sync_to_async
def _workspace_of(session_id: UUID) -> Workspace:
    sandbox = Sandbox.objects.get(sessions__pk=session_id)
    return sandbox_services.session_workspace(sandbox, session_id, just_read=True)
