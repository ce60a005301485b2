"""A session's queued prompts: stored rows, each change beside its event in one transaction.

A prompt sent while its session is busy (a turn runs, or the sandbox is still starting) waits
here, in order, until the session's runner starts it (see `SessionQueue.run`). Every
change is an event as well, so every tab, worker and reload sees the queue
(docs/websocket-api.md, "Queued prompts"); the row is what runs. Starting a queued prompt
deletes its row in the transaction that stores its `user_message`: it runs exactly once,
whichever worker starts it, even across a restart or a takeover.

These functions block (ORM): the runner calls them on the database threads, under its lease.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from uuid import UUID

from django.db import transaction
from django.db.models import Exists, Max, Min, OuterRef

from craft.commands import Attachment, Prompt
from craft.errors import Refused
from craft.models import Event, QueuedPrompt, Session, TurnRecord
from craft.storage.eventlog import Fence, Stored, append_events
from sandboxes.models import Sandbox

# The most prompts one session may have waiting.
MAX_QUEUED = 20
NOT_QUEUED = "that prompt is not queued any more: it has started or was removed"


def prompt_data(prompt: Prompt) -> dict[str, Any]:
    """What the log keeps of a prompt (never an image's bytes)."""
    data: dict[str, Any] = {"id": prompt.id, "text": prompt.text}
    if prompt.attachments:
        data["attachments"] = [attachment.stored() for attachment in prompt.attachments]
    return data


def waiting(session_id: UUID) -> int:
    """Return how many prompts of the session are queued."""
    return QueuedPrompt.objects.filter(session_id=session_id).count()


def enqueue(session_id: UUID, prompt: Prompt, fence: Fence | None) -> bool:
    """Queue the prompt at the end; False (nothing stored) for a prompt id already used."""
    with transaction.atomic():
        queued = QueuedPrompt.objects.filter(session_id=session_id)
        if (
            queued.filter(client_id=prompt.id).exists()
            or Event.objects.filter(session_id=session_id, client_id=prompt.id).exists()
        ):
            return False
        if queued.count() >= MAX_QUEUED:
            raise Refused("queue_full", f"at most {MAX_QUEUED} prompts can wait in a session")
        last = queued.aggregate(last=Max("position"))["last"]
        # The event first: it checks the fence (and that the session exists).
        append_events(session_id, [("prompt_queued", prompt_data(prompt))], fence=fence)
        QueuedPrompt.objects.create(
            session_id=session_id, client_id=prompt.id, text=prompt.text,
            position=0 if last is None else last + 1,
            attachments=[dataclasses.asdict(a) for a in prompt.attachments],
        )  # fmt: skip
    return True


def edit(session_id: UUID, client_id: str, text: str, fence: Fence | None) -> None:
    """Replace a queued prompt's text; Refused `not_queued` once it started or was removed."""
    with transaction.atomic():
        _locked(session_id, client_id).update(text=text)
        append_events(session_id, [("queued_prompt_edited", {"id": client_id, "text": text})],
                      fence=fence)  # fmt: skip


def remove(session_id: UUID, client_id: str, fence: Fence | None) -> None:
    """Take a prompt out of the queue; Refused `not_queued` once it started or was removed."""
    with transaction.atomic():
        _locked(session_id, client_id).delete()
        append_events(session_id, [("queued_prompt_removed", {"id": client_id})], fence=fence)


def steer(session_id: UUID, client_id: str, fence: Fence | None) -> None:
    """Move a queued prompt to the head of the queue (`prompt_steered`)."""
    with transaction.atomic():
        row = _locked(session_id, client_id)
        first = QueuedPrompt.objects.filter(session_id=session_id).aggregate(first=Min("position"))[
            "first"
        ]
        row.update(position=(first or 0) - 1)
        append_events(session_id, [("prompt_steered", {"id": client_id})], fence=fence)


def _locked(session_id: UUID, client_id: str) -> Any:
    rows = QueuedPrompt.objects.select_for_update().filter(
        session_id=session_id, client_id=client_id
    )
    if not rows.exists():
        raise Refused("not_queued", NOT_QUEUED)
    return rows


def start_next(session_id: UUID, fence: Fence | None) -> tuple[Prompt, Stored] | None:
    """Start the head of the queue: delete it and store its `user_message` (which starts the
    session's durable turn) in one transaction. None when the queue is empty."""
    with transaction.atomic():
        head = (
            QueuedPrompt.objects.select_for_update()
            .filter(session_id=session_id)
            .order_by("position")
            .first()
        )
        if head is None:
            return None
        head.delete()
        prompt = Prompt(
            head.client_id, head.text, tuple(Attachment(**item) for item in head.attachments)
        )
        stored = append_events(
            session_id, [("user_message", prompt_data(prompt))], client_id=prompt.id, fence=fence
        )
        if stored is None:  # its id was used meanwhile: it ran already
            return start_next(session_id, fence)
    return prompt, stored


def sessions_waiting() -> list[UUID]:
    """Sessions whose queue could run now: prompts waiting, no turn running, sandbox running."""
    running = TurnRecord.objects.running().filter(session=OuterRef("pk"))
    queued = QueuedPrompt.objects.filter(session=OuterRef("pk"))
    return list(
        Session.objects.filter(Exists(queued), ~Exists(running))
        .filter(sandbox__status=Sandbox.Status.RUNNING)
        .values_list("pk", flat=True)[:1000]
    )
