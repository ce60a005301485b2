"""A session's title: one writer for its three sources.

The owner names a session (on the page or through the API), its first prompt names it while it
has none, and the agent names it (`session_info_update`) unless its owner did. Whoever names
it, the title is cleaned like every stored text and recorded as a `session_title` event in
the same transaction as the row, so that every open page follows.
"""

from __future__ import annotations

from typing import Literal
from uuid import UUID

from django.db import transaction
from django.utils import timezone

from craft.errors import SessionError
from craft.models import Event, Session
from craft.storage.eventlog import Fence, append_events
from craft.storage.normalise import clean_title

DEFAULT_TITLE = "New session"
# A title made from a prompt is a summary of it.
PROMPT_TITLE_CHARS = 80

Source = Literal["user", "prompt", "agent"]


def set_session_title(
    session_id: UUID, title: str, source: Source, *, fence: Fence | None = None
) -> str | None:
    """Give the session `title` from `source`; return the title stored, or None if nothing
    changed.

    `user`: always (a title that is blank once cleaned raises SessionError); `prompt`:
    summarised to 80 characters, only while the session has the default title; `agent`: unless
    the owner named the session. Runs in one transaction; a writer under the session's lease
    passes its `fence`. A deleted session gets nothing.
    """
    if source == "prompt":
        cleaned = clean_title(title, PROMPT_TITLE_CHARS + 1)
        if len(cleaned) > PROMPT_TITLE_CHARS:
            cleaned = cleaned[: PROMPT_TITLE_CHARS - 1].rstrip() + "…"
    else:
        cleaned = clean_title(title)
    if not cleaned:
        if source == "user":
            raise SessionError("Give the session a title: it cannot be blank.")
        return None
    with transaction.atomic():
        sessions = Session.objects.filter(pk=session_id).exclude(title=cleaned)
        if source == "prompt":
            sessions = sessions.filter(title=DEFAULT_TITLE)
        elif (
            source == "agent"
            and Event.objects.filter(
                session_id=session_id, kind="session_title", data__source="user"
            ).exists()
        ):
            return None
        if not sessions.update(title=cleaned, updated_at=timezone.now()):
            return None
        append_events(
            session_id, [("session_title", {"title": cleaned, "source": source})], fence=fence
        )
    return cleaned
