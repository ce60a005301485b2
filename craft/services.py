"""Every state change of a chat session goes through these verbs.

They block (ORM, sandbox and process calls): async callers wrap them in `sync_to_async`.
Sandboxes are reached only through `sandboxes.services`.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from craft.cluster import ownership, workers
from craft.live import delivery
from craft.models import Session
from craft.storage.eventlog import append_events
from craft.storage.normalise import clean_title
from craft.turns import controls
from craft.turns.runner import Refused, runners
from sandboxes import services as sandbox_services
from sandboxes.backends import SandboxError
from sandboxes.models import Sandbox

logger = logging.getLogger(__name__)


class SessionError(Exception):
    """A session operation was refused; the message is fit to show to the user."""


class SessionLimit(SessionError):
    """The user has as many sessions as one person may have."""


def open_session(user: User, title: str = "") -> Session:
    """Create a session in the user's sandbox, at once.

    A sandbox that is not running yet is provisioned in the background (see
    `sandbox_services.request_sandbox`): the session's page follows its progress, and its
    agent starts, in the session's own workspace, at the first prompt after it is ready.
    Raises SessionLimit when the user has CRAFT_MAX_SESSIONS_PER_USER sessions (concurrent
    requests can pass it by a few), SessionError when the sandbox is being stopped.
    """
    limit = settings.CRAFT_MAX_SESSIONS_PER_USER
    if limit and Session.objects.owned_by(user).count() >= limit:
        raise SessionLimit(
            f"you have {limit} sessions, the most one person can have: delete some first"
        )
    sandbox = sandbox_services.request_sandbox(user)
    if sandbox.status not in (Sandbox.Status.RUNNING, Sandbox.Status.PROVISIONING):
        # Terminating (a failed one was claimed for provisioning above).
        raise SessionError("your sandbox is being stopped: open a session again in a moment")
    return Session.objects.create(
        owner=user, sandbox=sandbox, title=clean_title(title) or "New session"
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
        transaction.on_commit(
            lambda: delivery.tell_session(session_id, {"type": "session.deleted"})
        )
    runners.forget(session_id)


# --- Turns (async: they run on the event loop, see craft.turns.runner) -----------------------


async def handle_frame(session_id: uuid.UUID, frame: dict[str, Any]) -> None:
    """Carry out a validated `prompt`, `cancel`, `permission`, `set_config_option` or
    `set_mode` frame of a session.

    In the worker that owns the session's agent (see craft.cluster.ownership): here, or forwarded to
    it. Raises `runner.Refused` with the error for the client (a prompt while a turn runs,
    a cancel without one, an unknown permission request, a config value the agent does not
    offer...). A repeated prompt id is ignored.
    """
    await ownership.route(session_id, frame, _handle_here)


async def _handle_here(session_id: uuid.UUID, frame: dict[str, Any], token: int) -> None:
    runner = runners.get(session_id)
    runner.fence = (workers.me().key, token)
    kind = frame["type"]
    if kind == "prompt":
        attachments = _checked_attachments(frame.get("attachments"))
        await runner.prompt(frame["id"], frame["text"], attachments)
    elif kind == "cancel":
        await runner.cancel()
    elif kind == "permission":
        await runner.answer_permission(frame["request"], frame["option"])
    elif kind == "set_config_option":
        await runner.set_config_option(frame["config"], frame["value"])
    elif kind == "set_mode":
        await runner.set_mode(frame["mode"])
    else:
        raise ValueError(f"not a session frame: {kind!r}")


def _checked_attachments(raw: object) -> list[controls.Attachment]:
    try:
        return controls.parse_attachments(raw)
    except controls.Invalid as invalid:
        raise Refused(invalid.code, invalid.message) from None


async def post_prompt(
    session_id: uuid.UUID, client_id: str, text: str, attachments: object = None
) -> None:
    """Store the prompt and start its turn in the background (see `handle_frame`).

    `attachments` is the prompt frame's list of files and images (docs/websocket-api.md),
    checked here before the frame goes anywhere. Raises `runner.Refused` for an empty or
    oversized prompt, attachments that are malformed, too big or not taken by the agent,
    or while a turn is running.
    """
    frame: dict[str, Any] = {"type": "prompt", "id": client_id, "text": text}
    if attachments is not None:
        _checked_attachments(attachments)
        frame["attachments"] = attachments
    await handle_frame(session_id, frame)


async def set_config_option(session_id: uuid.UUID, config_id: str, value: str) -> None:
    """Change one of the agent's session config options (starting the agent if needed).

    The agent's answer, every option with its current value, is stored as a
    `config_option_update` event. Raises `runner.Refused` for an option or value the agent
    does not offer, or when the agent refuses.
    """
    await handle_frame(
        session_id, {"type": "set_config_option", "config": config_id, "value": value}
    )


async def set_mode(session_id: uuid.UUID, mode_id: str) -> None:
    """Switch the agent to one of its modes; stored as a `current_mode_update` event."""
    await handle_frame(session_id, {"type": "set_mode", "mode": mode_id})


async def cancel_turn(session_id: uuid.UUID) -> None:
    """Cancel the session's running turn; it ends with stop reason `cancelled`."""
    await handle_frame(session_id, {"type": "cancel"})


async def answer_permission(session_id: uuid.UUID, request_id: str, option_id: str) -> None:
    """Answer an open permission request of the session's running turn."""
    await handle_frame(
        session_id, {"type": "permission", "request": request_id, "option": option_id}
    )


async def _lose(session_id: uuid.UUID) -> None:
    await runners.get(session_id).lose()


# Frames forwarded by other workers are handled as this worker's own; a lost lease stops the
# session's agent here.
ownership.listener.handler = _handle_here
ownership.ownership.on_lost = _lose
