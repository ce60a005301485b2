"""Every state change of a chat session goes through these verbs.

They block (ORM, sandbox and process calls): async callers wrap them in `sync_to_async`.
Sandboxes are reached only through `sandboxes.services`.
"""

from __future__ import annotations

import logging
import uuid

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from sandboxes import services as sandbox_services
from sandboxes.backends import SandboxError
from sandboxes.models import Sandbox

from . import live
from .eventlog import append_events
from .models import Session
from .runner import runners

logger = logging.getLogger(__name__)

MAX_TITLE = 200


class SessionError(Exception):
    """A session operation was refused; the message is fit to show to the user."""


class SessionLimit(SessionError):
    """The user has as many sessions as one person may have."""


def open_session(user: User, title: str = "") -> Session:
    """Create a session in the user's sandbox (provisioning it first if needed).

    The workspace is created before the row is saved, so a session row always has a
    workspace. Raises SessionLimit when the user has CRAFT_MAX_SESSIONS_PER_USER sessions
    (concurrent requests can pass it by a few), SessionError when the sandbox cannot run.
    """
    limit = settings.CRAFT_MAX_SESSIONS_PER_USER
    if limit and Session.objects.owned_by(user).count() >= limit:
        raise SessionLimit(
            f"you have {limit} sessions, the most one person can have: delete some first"
        )
    sandbox = sandbox_services.provision_sandbox(user)
    if sandbox.status != Sandbox.Status.RUNNING:
        detail = sandbox.error or sandbox.status_detail or sandbox.status
        raise SessionError(f"your sandbox is {sandbox.status}: {detail}")
    session_id = uuid.uuid4()
    try:
        sandbox_services.create_session_workspace(sandbox, session_id)
    except SandboxError as exc:
        raise SessionError(str(exc)) from exc
    return Session.objects.create(
        id=session_id, owner=user, sandbox=sandbox, title=clean_title(title) or "New session"
    )


def rename_session(session: Session, title: str) -> Session:
    """Give the session a new title and record it as a `session_title` event.

    The event reaches every open page of the session (heading, tab title, sidebar) like any
    other. Renaming to the current title stores nothing. Raises SessionError for a blank title.
    """
    cleaned = clean_title(title)
    if not cleaned:
        raise SessionError("Give the session a title: it cannot be blank.")
    with transaction.atomic():
        changed = (
            Session.objects.filter(pk=session.pk)
            .exclude(title=cleaned)
            .update(title=cleaned, updated_at=timezone.now())
        )
        if changed:
            append_events(session.pk, [("session_title", {"title": cleaned, "source": "user"})])
    session.refresh_from_db()
    return session


def delete_session(session: Session) -> None:
    """Stop the session's agent, remove its workspace, then delete it and its events."""
    try:
        sandbox_services.remove_session_workspace(session.sandbox, session.pk)
    except SandboxError as exc:
        # The record goes anyway: a leftover folder is better than an undeletable session.
        logger.warning("removing workspace of session %s failed: %s", session.pk, exc)
    with transaction.atomic():
        session_id = session.pk
        session.delete()
        transaction.on_commit(lambda: live.tell_session(session_id, {"type": "session.deleted"}))
    runners.forget(session_id)


def clean_title(title: str) -> str:
    return " ".join(str(title).split())[:MAX_TITLE]


# --- Turns (async: they run on the event loop, see craft.runner) ------------------------------


async def post_prompt(session_id: uuid.UUID, client_id: str, text: str) -> bool:
    """Store the prompt and start its turn in the background.

    Return False when `client_id` was already used in this session (the repeat is ignored).
    Raises `runner.Refused` for an empty or oversized prompt, or while a turn is running.
    """
    return await runners.get(session_id).prompt(client_id, text)


async def cancel_turn(session_id: uuid.UUID) -> None:
    """Cancel the session's running turn; it ends with stop reason `cancelled`."""
    await runners.get(session_id).cancel()


async def answer_permission(session_id: uuid.UUID, request_id: str, option_id: str) -> None:
    """Answer an open permission request of the session's running turn."""
    await runners.get(session_id).answer_permission(request_id, option_id)
