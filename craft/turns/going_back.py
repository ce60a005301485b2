"""Going back in a conversation: fork a session from one of its turns, or rewind it to one.

Both take the conversation and the workspace as they were just after a turn (named by its
user_message's seq) and are carried out by the session's runner between turns (refused
`turn_running` while one runs; the runner holds its lock):

* **fork**: a new session of the same owner, sandbox and agent gets the source's
  conversation up to the end of that turn (`COPIED` kinds, renumbered from 1; turns set
  aside by a rewind are left out) and a `forked` event; its checkpoint store is a copy of
  the source's, and its workspace gets the files of the checkpoint after that turn (one run
  of the workspace tool, as the sandbox's user: `Workspace.fork_from`). Each turn it copies
  keeps its checkpoints (the source's commits, now the fork's too): its changes can be
  reverted, and the fork rewound to it, as in the source.
* **rewind**: the workspace goes back to that checkpoint (recorded before and after, as a
  revert is), the later turns are set aside, and a `rewound` event names them.

Either way the agent's own conversation must follow. Its next agent session is a new one
(the fork's has none yet; a rewind forgets the session's), and the first prompt it gets
carries the transcript of the conversation so far (`transcript_block`): what was said in
the turns kept, never in those set aside.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django.db import transaction
from django.db.models import Q

from craft.errors import Refused
from craft.models import Event, Session, WorkspaceRevert
from craft.storage.db import db_sync_to_async
from craft.storage.eventlog import Fence, append_events, turn_rows
from craft.storage.normalise import clean_title
from craft.turns.checkpoints import (
    MAX_FILES,
    checkpoint_calls,
    latest_checkpoint,
    latest_checkpoints,
)
from sandboxes import services as sandbox_services
from sandboxes.backends import SandboxError
from sandboxes.workspace import Workspace, WorkspaceRefused

# What a fork keeps of each turn: what was said and done, and how it ended. Not kept:
# permission and elicitation requests and answers (nothing is open in a fork), the queue,
# the agent's announcements (its new agent announces its own), turn_changes and reverts
# (the page would offer to revert what the fork's own log never showed).
COPIED = frozenset(
    {
        "user_message", "agent_message_chunk", "agent_thought_chunk", "tool_call",
        "tool_call_update", "plan", "agent_error", "turn_end", "terminal_output_limited",
    }
)  # fmt: skip
# The events after which the agent's next new session is given the transcript.
MARKERS = ("forked", "rewound")
# The most characters of transcript a new agent session is given (the latest are kept).
MAX_TRANSCRIPT_CHARS = 200_000
FORK_SUFFIX = " (fork)"


@dataclass(frozen=True)
class TurnSpan:
    """One turn of the log: its user_message's seq and its turn_end's (0: not ended)."""

    prompt: int
    end: int


def set_aside(session_id: UUID) -> set[int]:
    """Return the turns (their user_message's seq) that rewinds set aside."""
    aside: set[int] = set()
    for data in Event.objects.filter(session_id=session_id, kind="rewound").values_list(
        "data", flat=True
    ):
        aside.update(seq for seq in data.get("turns", []) if isinstance(seq, int))
    return aside


def turns_of(session_id: UUID) -> list[TurnSpan]:
    """Return the session's turns in order, from its user_message and turn_end events."""
    spans: list[TurnSpan] = []
    rows = (
        Event.objects.filter(session_id=session_id, kind__in=("user_message", "turn_end"))
        .order_by("seq")
        .values_list("seq", "kind")
    )
    for seq, kind in rows:
        if kind == "user_message":
            spans.append(TurnSpan(seq, 0))
        elif spans and not spans[-1].end:
            spans[-1] = TurnSpan(spans[-1].prompt, seq)
    return spans


def _turn_at(session_id: UUID, seq: int) -> tuple[TurnSpan, list[TurnSpan], set[int]]:
    """Return turn `seq` (ended, not set aside), the session's turns and those set aside;
    raise Refused `invalid` if `seq` is no such turn."""
    spans = turns_of(session_id)
    aside = set_aside(session_id)
    for span in spans:
        if span.prompt == seq and span.prompt not in aside:
            if not span.end:
                raise Refused("turn_running", "that turn has not ended")
            return span, spans, aside
    raise Refused("invalid", "'seq' must name a user message of the session (a turn)")


def _checkpoint_after(session_id: UUID, span: TurnSpan, spans: list[TurnSpan]) -> str:
    """Return the checkpoint of the workspace as it was just after turn `span`: the latest
    taken before the next turn (or before now, for the last one)."""
    later = [each.prompt for each in spans if each.prompt > span.prompt]
    commit = latest_checkpoint(session_id, before=later[0] if later else None)
    if not commit:
        raise Refused("no_checkpoint", "there is no checkpoint of the files after that turn")
    return commit


# --- fork -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CopiedTurn:
    """A turn a fork copies: its prompt's seq in the source, and the checkpoints the fork's
    TurnRecord row gets (the first turn's state before it; the state just after each)."""

    prompt: int
    checkpoint_before: str
    checkpoint_after: str


@dataclass(frozen=True)
class ForkPlan:
    source: Session
    events: list[tuple[int, str, dict[str, Any]]]  # (seq in the source, kind, data)
    commit: str
    turns: list[CopiedTurn]


def plan_fork(session_id: UUID, seq: int, before: bool = False) -> ForkPlan:
    """Return what a fork from turn `seq` copies (up to its end, or to its start if
    `before`): the events, the checkpoint and the checkpoints of the turns copied."""
    span, spans, aside = _turn_at(session_id, seq)
    source = Session.objects.select_related("sandbox").get(pk=session_id)
    if before:
        commit = latest_checkpoint(session_id, before=span.prompt)
        if not commit:
            raise Refused("no_checkpoint", "there is no checkpoint of the files before that turn")
    else:
        commit = _checkpoint_after(session_id, span, spans)
    last = span.prompt - 1 if before else span.end
    skipped = [(each.prompt, each.end or 2**63) for each in spans if each.prompt in aside]
    events = [
        (event_seq, kind, data)
        for event_seq, kind, data in Event.objects.filter(
            session_id=session_id, seq__lte=last, kind__in=COPIED
        )
        .order_by("seq")
        .values_list("seq", "kind", "data")
        if not any(start <= event_seq <= end for start, end in skipped)
    ]
    return ForkPlan(source, events, commit, _copied_turns(session_id, spans, aside, last, commit))


def _copied_turns(
    session_id: UUID, spans: list[TurnSpan], aside: set[int], last: int, commit: str
) -> list[CopiedTurn]:
    """Return the turns a fork copies (those kept up to seq `last`) with their checkpoints:
    each the state just after it, as `_checkpoint_after` finds it; the last, `commit` (the
    fork's files); the first also the state before it."""
    copied = [each for each in spans if each.prompt <= last and each.prompt not in aside]
    if not copied:
        return []
    nexts: list[int | None] = []
    for each in copied:
        later = [other.prompt for other in spans if other.prompt > each.prompt]
        nexts.append(later[0] if later else None)
    first_before, *afters = latest_checkpoints(session_id, [copied[0].prompt, *nexts])
    afters[-1] = commit
    return [
        CopiedTurn(each.prompt, first_before if index == 0 else "", after)
        for index, (each, after) in enumerate(zip(copied, afters, strict=True))
    ]


def copy_workspace(plan: ForkPlan, target: Workspace) -> dict[str, Any]:
    """Start the fork's workspace and checkpoints from the plan's checkpoint (see the
    module's docstring); the caller runs it on a checkpoint thread."""
    from django.conf import settings

    return target.fork_from(plan.source.pk, plan.commit, settings.CRAFT_ARCHIVE_MAX_BYTES)


def workspace_for_fork(plan: ForkPlan, new_id: UUID) -> Workspace:
    """Return the fork's workspace (made now, empty); the sandbox runs."""
    return sandbox_services.writable_workspace(plan.source.sandbox, new_id)


@transaction.atomic
def store_fork(plan: ForkPlan, new_id: UUID, seq: int, before: bool) -> Session:
    """Create the fork: its row, the copied events renumbered from 1, the copied turns
    (ended, with their checkpoints) and its `forked` event."""
    source = plan.source
    title = clean_title(source.title[: 200 - len(FORK_SUFFIX)] + FORK_SUFFIX)
    session = Session.objects.create(
        id=new_id, owner_id=source.owner_id, sandbox_id=source.sandbox_id, title=title,
        agent=source.agent,
    )  # fmt: skip
    # What the agent said of its workspace's paths names the source's workspace: the fork's
    # is the same but for the session's id (and the page shows its own workspace's paths
    # relative, never the host's).
    here, there = f"/sessions/{source.pk}", f"/sessions/{new_id}"
    Event.objects.bulk_create(
        Event(session=session, seq=number, kind=kind, data=_moved(data, here, there))
        for number, (_, kind, data) in enumerate(plan.events, start=1)
    )
    renumbered = {old: number for number, (old, _, _) in enumerate(plan.events, start=1)}
    copies = [
        (turn.prompt, renumbered[turn.prompt], turn.checkpoint_before, turn.checkpoint_after)
        for turn in plan.turns
        if turn.prompt in renumbered
    ]
    turn_rows.copy_ended(source.pk, session.pk, copies)
    session.last_seq = len(plan.events)
    session.save(update_fields=["last_seq"])
    forked: dict[str, Any] = {"from": str(source.pk), "seq": seq, "title": source.title}
    if before:
        forked["before"] = True
    append_events(new_id, [("forked", forked)])
    return session


def _moved(data: dict[str, Any], here: str, there: str) -> dict[str, Any]:
    """Return `data` with every `here` in its strings (keys too) spelled `there`."""
    text = json.dumps(data)
    return json.loads(text.replace(here, there)) if here in text else data


# --- rewind ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RewindPlan:
    to: int
    turns: list[int]  # the turns set aside now
    commit: str


def plan_rewind(session_id: UUID, seq: int) -> RewindPlan:
    """Return what a rewind to turn `seq` sets aside and the checkpoint it goes back to;
    Refused `nothing_to_rewind` when no turn kept comes after it."""
    span, spans, aside = _turn_at(session_id, seq)
    later = [
        each.prompt for each in spans if each.prompt > span.prompt and each.prompt not in aside
    ]
    if not later:
        raise Refused("nothing_to_rewind", "no turn comes after that one")
    return RewindPlan(seq, later, _checkpoint_after(session_id, span, spans))


@transaction.atomic
def store_rewind(
    session_id: UUID, data: dict[str, Any], before: str, after: str, fence: Fence | None
) -> None:
    """Store the `rewound` event with its checkpoints (it can be reverted as a revert can),
    and forget the agent's session: the next agent starts a new one, given the transcript."""
    stored = append_events(session_id, [("rewound", data)], fence=fence)
    if stored is None:
        return
    WorkspaceRevert.objects.create(
        session_id=session_id, seq=stored.first_seq, checkpoint_before=before,
        checkpoint_after=after,
    )  # fmt: skip
    Session.objects.filter(pk=session_id).update(agent_session_id="")


def rewind_workspace(workspace: Workspace, plan: RewindPlan) -> tuple[str, str, dict[str, Any]]:
    """Put the workspace back to the plan's checkpoint, recorded before and after; return
    the two checkpoints and the files that changed."""
    current = workspace.checkpoint(f"before rewinding to turn {plan.to}")
    workspace.revert(plan.commit, current.commit)
    restored = workspace.checkpoint(f"rewind to turn {plan.to}")
    changes = workspace.changes(current.commit, restored.commit, MAX_FILES)
    return current.commit, restored.commit, changes


# --- the transcript a new agent session is given --------------------------------------------


def pending_transcript(session_id: UUID) -> str:
    """Return the transcript the session's next new agent session is to be given: after a
    `forked` or `rewound` event that no turn has ended since; "" otherwise."""
    # Looked for after the last turn's end only: read backwards from the log's end, both
    # stop near it, where a long session's agent start would otherwise read all its events.
    events = Event.objects.filter(session_id=session_id).order_by("-seq")
    ended = events.filter(kind="turn_end").values_list("seq", flat=True).first() or 0
    marker = events.filter(kind__in=MARKERS, seq__gt=ended).values_list("seq", flat=True).first()
    return "" if marker is None else transcript(session_id, marker)


def transcript(session_id: UUID, until: int) -> str:
    """Return what was said in the session's kept turns before seq `until`, oldest first."""
    aside = set_aside(session_id)
    spans = [span for span in turns_of(session_id) if span.prompt < until]
    skipped = [(span.prompt, span.end or until) for span in spans if span.prompt in aside]
    parts: list[str] = []
    said: list[str] = []
    rows = (
        Event.objects.filter(session_id=session_id, seq__lt=until)
        .filter(Q(kind="user_message") | Q(kind="agent_message_chunk"))
        .order_by("seq")
        .values_list("seq", "kind", "data")
    )
    for seq, kind, data in rows:
        if any(start <= seq <= end for start, end in skipped):
            continue
        if kind == "user_message":
            if said:
                parts.append(f"<agent>\n{''.join(said)}\n</agent>")
                said = []
            parts.append(f"<user>\n{data.get('text', '')}\n</user>")
        else:
            content = data.get("content")
            if isinstance(content, dict) and isinstance(content.get("text"), str):
                said.append(content["text"])
    if said:
        parts.append(f"<agent>\n{''.join(said)}\n</agent>")
    if not parts:
        return ""
    text = "\n".join(parts)[-MAX_TRANSCRIPT_CHARS:]
    return TRANSCRIPT_INTRO + text


TRANSCRIPT_INTRO = (
    "This conversation continues an earlier one, of which you remember nothing. "
    "What was said so far, oldest first (the user's words in <user>, yours in <agent>):\n"
)
TRANSCRIPT_URI = "craft:transcript"


def transcript_block(text: str, embedded_context: bool) -> dict[str, Any]:
    """Return the transcript as an ACP content block: an embedded resource for an agent that
    takes them (`promptCapabilities.embeddedContext`), else text."""
    if embedded_context:
        return {
            "type": "resource",
            "resource": {"uri": TRANSCRIPT_URI, "mimeType": "text/plain", "text": text},
        }
    return {"type": "text", "text": text}


# --- carried out by the session's runner (on the event loop) --------------------------------


async def fork(session_id: UUID, seq: int, new_id: UUID, before: bool = False) -> None:
    """Fork the session from turn `seq` (just after it, or just `before` it) as session
    `new_id` (see the module's docstring).
    Raises Refused: `invalid`, `no_checkpoint`, `sandbox_unavailable`, or the workspace
    tool's refusal."""
    plan = await db_sync_to_async(plan_fork)(session_id, seq, before)
    loop = asyncio.get_running_loop()
    try:
        target = await db_sync_to_async(workspace_for_fork)(plan, new_id)
        await loop.run_in_executor(checkpoint_calls, copy_workspace, plan, target)
    except sandbox_services.SandboxUnavailable as exc:
        raise Refused("sandbox_unavailable", str(exc)) from None
    except WorkspaceRefused as exc:
        raise Refused(exc.code, f"the files could not be copied: {exc}") from None
    except SandboxError as exc:
        raise Refused("workspace_unavailable", f"the files could not be copied: {exc}") from None
    await db_sync_to_async(store_fork)(plan, new_id, seq, before)


async def rewind(session_id: UUID, seq: int, fence: Fence | None) -> None:
    """Rewind the session to turn `seq` (see the module's docstring); the caller drops the
    agent's connection after. Raises Refused: `invalid`, `nothing_to_rewind`,
    `no_checkpoint`, `sandbox_unavailable`, `workspace_unavailable`."""
    plan = await db_sync_to_async(plan_rewind)(session_id, seq)
    loop = asyncio.get_running_loop()
    try:
        workspace = await db_sync_to_async(_workspace_of)(session_id)
        before, after, changes = await loop.run_in_executor(
            checkpoint_calls, rewind_workspace, workspace, plan
        )
    except sandbox_services.SandboxUnavailable as exc:
        raise Refused("sandbox_unavailable", str(exc)) from None
    except WorkspaceRefused as exc:
        raise Refused(exc.code, str(exc)) from None
    except SandboxError as exc:
        raise Refused("workspace_unavailable", f"the workspace cannot be rewound: {exc}") from None
    data = {"to": seq, "turns": plan.turns, "files": changes["files"],
            "truncated": changes["truncated"]}  # fmt: skip
    await db_sync_to_async(store_rewind)(session_id, data, before, after, fence)


def _workspace_of(session_id: UUID) -> Workspace:
    sandbox = Session.objects.select_related("sandbox").get(pk=session_id).sandbox
    return sandbox_services.session_workspace(sandbox, session_id, just_read=True)
