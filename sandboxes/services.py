"""Every state change of a sandbox and its agent connections goes through these verbs.

They block (ORM, backend and process calls): async callers wrap them in `sync_to_async`.
The `craft` app uses this module, never the backends or the connection cache directly.
"""

from __future__ import annotations

import logging
from uuid import UUID

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from .acp import AgentConnection
from .backends import SandboxError, get_backend
from .connections import agent_connections
from .models import Sandbox

logger = logging.getLogger(__name__)


class SandboxUnavailable(SandboxError):
    """The sandbox is not running, so nothing can run in it."""


def provision_sandbox(user: User) -> Sandbox:
    """Return the user's live sandbox, creating and provisioning it if there is none.

    Concurrent calls for one user create exactly one row: the partial unique constraint on
    owner makes a second insert fail, and the loser reads the winner's row. Only the caller
    that moves the row into `provisioning` (a conditional update) talks to the backend; the
    others return the row as it is. A failed sandbox is provisioned again (the retry path).
    Backend errors leave the sandbox `failed` with the error text; they are not raised.
    """
    sandbox = _get_or_create_row(user)
    claimed = (
        Sandbox.objects.filter(pk=sandbox.pk, status=Sandbox.Status.FAILED).update(
            status=Sandbox.Status.PROVISIONING, error="", status_detail="retrying"
        )
        == 1
    )
    if sandbox.status == Sandbox.Status.PROVISIONING and getattr(sandbox, "_created", False):
        claimed = True
    if claimed:
        _run_provisioning(sandbox)
    sandbox.refresh_from_db()
    return sandbox


def _get_or_create_row(user: User) -> Sandbox:
    existing = Sandbox.objects.live().owned_by(user).first()
    if existing is not None:
        return existing
    try:
        with transaction.atomic():
            sandbox = Sandbox.objects.create(
                owner=user,
                backend=settings.CRAFT_SANDBOX_BACKEND,
                status=Sandbox.Status.PROVISIONING,
                status_detail="queued",
            )
    except IntegrityError:
        return Sandbox.objects.live().owned_by(user).get()
    sandbox._created = True  # type: ignore[attr-defined]
    return sandbox


def _run_provisioning(sandbox: Sandbox) -> None:
    backend = get_backend(sandbox.backend)

    def progress(detail: str) -> None:
        Sandbox.objects.filter(pk=sandbox.pk).update(status_detail=detail[:500])

    try:
        reference = backend.provision(sandbox, progress)
    except Exception as exc:
        logger.warning("provisioning sandbox %s failed: %s", sandbox.pk, exc)
        Sandbox.objects.filter(pk=sandbox.pk, status=Sandbox.Status.PROVISIONING).update(
            status=Sandbox.Status.FAILED, error=str(exc) or exc.__class__.__name__
        )
        return
    Sandbox.objects.filter(pk=sandbox.pk, status=Sandbox.Status.PROVISIONING).update(
        status=Sandbox.Status.RUNNING,
        reference=reference,
        status_detail="ready",
        error="",
        last_activity_at=timezone.now(),
    )


def terminate_sandbox(sandbox: Sandbox) -> Sandbox:
    """Stop every agent connection of the sandbox, free its resources, mark it terminated.

    Idempotent. Resources already gone count as freed; if the backend fails, the sandbox stays
    `terminating` with the error, and calling this again retries.
    """
    Sandbox.objects.filter(pk=sandbox.pk).exclude(status=Sandbox.Status.TERMINATED).update(
        status=Sandbox.Status.TERMINATING, status_detail="terminating"
    )
    sandbox.refresh_from_db()
    if sandbox.status == Sandbox.Status.TERMINATED:
        return sandbox
    stopped = agent_connections.stop_sandbox(sandbox.pk)
    logger.info("terminating sandbox %s: stopped %d agent connection(s)", sandbox.pk, stopped)
    try:
        get_backend(sandbox.backend).terminate(sandbox)
    except Exception as exc:
        Sandbox.objects.filter(pk=sandbox.pk).update(error=f"terminate failed: {exc}")
        sandbox.refresh_from_db()
        return sandbox
    Sandbox.objects.filter(pk=sandbox.pk).update(
        status=Sandbox.Status.TERMINATED, status_detail="terminated", terminated_at=timezone.now()
    )
    sandbox.refresh_from_db()
    return sandbox


def require_running(sandbox: Sandbox) -> None:
    """Raise SandboxUnavailable unless the sandbox is running now (read from the database)."""
    status = Sandbox.objects.filter(pk=sandbox.pk).values_list("status", flat=True).first()
    if status != Sandbox.Status.RUNNING:
        raise SandboxUnavailable(f"sandbox is {status or 'gone'}")


def create_session_workspace(sandbox: Sandbox, session_id: UUID) -> None:
    """Create the session's workspace folder in the sandbox."""
    require_running(sandbox)
    get_backend(sandbox.backend).create_workspace(sandbox, session_id)


def remove_session_workspace(sandbox: Sandbox, session_id: UUID) -> None:
    """Stop the session's agent connection (if any) and remove its workspace."""
    agent_connections.stop_session(sandbox.pk, session_id)
    if sandbox.status in (Sandbox.Status.RUNNING, Sandbox.Status.FAILED):
        get_backend(sandbox.backend).remove_workspace(sandbox, session_id)


def connect_agent(sandbox: Sandbox, session_id: UUID) -> AgentConnection:
    """Return the session's cached agent connection, starting the agent if there is none.

    The first call starts the agent in the session's workspace and opens its ACP session;
    later calls return the same connection while its process lives, or a new one if it died.
    Raises SandboxUnavailable unless the sandbox is running.
    """
    require_running(sandbox)
    connection = agent_connection(sandbox, session_id)
    touch_sandbox(sandbox.pk)
    return connection


def agent_connection(sandbox: Sandbox, session_id: UUID) -> AgentConnection:
    """Like `connect_agent`, for a sandbox the caller has just seen running.

    It does no database work: it can block for an agent's start (seconds on Kubernetes)
    without holding a database connection.
    """
    backend = get_backend(sandbox.backend)

    def start() -> AgentConnection:
        process = backend.start_agent(sandbox, session_id)
        connection = AgentConnection(
            process,
            cwd=backend.workspace_path(sandbox, session_id),
            max_message_bytes=settings.CRAFT_MAX_MESSAGE_BYTES,
        )
        connection.start(timeout=settings.CRAFT_AGENT_START_TIMEOUT)
        logger.info("started agent %s for session %s", process.ident, session_id)
        return connection

    return agent_connections.get_or_start(sandbox.pk, session_id, start)


def touch_sandbox(sandbox_id: UUID) -> None:
    """Record that the sandbox is in use now (its idle time starts again)."""
    Sandbox.objects.filter(pk=sandbox_id).update(last_activity_at=timezone.now())


def stop_idle_connections(sandbox: Sandbox | None = None, idle_seconds: float = 0.0) -> int:
    """Stop agent connections without a running turn (of one sandbox, or all)."""
    return agent_connections.stop_idle(sandbox.pk if sandbox else None, idle_seconds)


def stop_all_agents() -> int:
    """Stop every agent connection of this process, all at once; return how many."""
    return agent_connections.stop_all()


def live_connection_count(sandbox_id: UUID | None = None) -> int:
    return agent_connections.count(sandbox_id)
