"""Every state change of a chat session goes through these verbs.

They block (ORM, sandbox and process calls): async callers wrap them in `sync_to_async`.
Sandboxes are reached only through `sandboxes.services`.
"""

from __future__ import annotations

import logging
import uuid

from django.db import transaction
from django.utils import timezone

from sandboxes import services as sandbox_services
from sandboxes.backends import SandboxError
from sandboxes.models import Sandbox

from .models import Session

logger = logging.getLogger(__name__)

MAX_TITLE = 200


class SessionError(Exception):
    """A session operation was refused; the message is fit to show to the user."""


def open_session(user: object, title: str = "") -> Session:
    """Create a session in the user's sandbox (provisioning it first if needed).

    The workspace is created before the row is saved, so a session row always has a
    workspace. Raises SessionError when the sandbox cannot run.
    """
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
    cleaned = clean_title(title)
    if not cleaned:
        raise SessionError("a title cannot be empty")
    Session.objects.filter(pk=session.pk).update(title=cleaned, updated_at=timezone.now())
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
        session.delete()


def clean_title(title: str) -> str:
    return " ".join(str(title).split())[:MAX_TITLE]


def run_prompt(session: Session, text: str, *, turn_timeout: float = 300.0) -> str:
    """Send a prompt and store the whole turn in the event log; return the stop reason.

    Blocking, for the plain HTML form: it waits for the turn to end. Permission requests are
    rejected, because a form post cannot ask the person.
    """
    from sandboxes.acp import AgentError, PermissionRequest, TurnEnd, TurnFailed, Update

    from .eventlog import append_event

    text = text.strip()
    if not text:
        raise SessionError("a prompt cannot be empty")
    append_event(session.pk, "user_message", {"text": text})
    try:
        connection = sandbox_services.connect_agent(session.sandbox, session.pk)
    except (SandboxError, AgentError) as exc:
        append_event(session.pk, "agent_error", {"message": str(exc)})
        return "error"
    stop_reason = "error"
    try:
        for item in connection.iter_prompt(text, timeout=turn_timeout):
            if isinstance(item, Update):
                append_event(session.pk, item.kind, item.data)
            elif isinstance(item, PermissionRequest):
                append_event(
                    session.pk,
                    "permission_request",
                    {
                        "request": item.request_id,
                        "toolCall": item.tool_call,
                        "options": item.options,
                    },
                )
                reject = next(
                    (
                        o["optionId"]
                        for o in item.options
                        if str(o.get("kind", "")).startswith("reject")
                    ),
                    None,
                )
                connection.answer_permission(item.request_id, reject)
                append_event(
                    session.pk, "permission_answer", {"request": item.request_id, "option": reject}
                )
            elif isinstance(item, TurnEnd):
                stop_reason = item.stop_reason
                append_event(session.pk, "turn_end", {"stop_reason": stop_reason})
            elif isinstance(item, TurnFailed):
                append_event(session.pk, "agent_error", {"message": item.message})
    except AgentError as exc:
        append_event(session.pk, "agent_error", {"message": str(exc)})
    return stop_reason
