"""What a session's runner reads and writes in the database besides the event log."""

from __future__ import annotations

from uuid import UUID

from craft.models import Event, Session
from craft.storage.db import db_sync_to_async
from sandboxes import services as sandbox_services
from sandboxes.models import Sandbox


@db_sync_to_async
def prompt_seen(session_id: UUID, client_id: str) -> bool:
    """Return whether the session has stored a prompt with this client id."""
    return Event.objects.filter(session_id=session_id, client_id=client_id).exists()


@db_sync_to_async
def sandbox_status(session_id: UUID) -> str | None:
    return Sandbox.objects.filter(sessions__pk=session_id).values_list("status", flat=True).first()


@db_sync_to_async
def start_of(session_id: UUID) -> tuple[Sandbox, str]:
    """Return the session's sandbox, checked to be running, and the agent's last session id
    (empty at the session's first start)."""
    session = Session.objects.select_related("sandbox").get(pk=session_id)
    sandbox_services.require_running(session.sandbox)
    return session.sandbox, session.agent_session_id


@db_sync_to_async
def record_start(session_id: UUID, sandbox_id: UUID, agent_session_id: str | None) -> None:
    """Note the sandbox's activity and the agent's session id (what a restart reattaches to)."""
    sandbox_services.touch_sandbox(sandbox_id)
    if agent_session_id:
        Session.objects.filter(pk=session_id).exclude(agent_session_id=agent_session_id).update(
            agent_session_id=agent_session_id
        )
