"""What a session's runner reads and writes in the database besides the event log."""

from __future__ import annotations

from typing import NamedTuple
from uuid import UUID

from craft import credentials
from craft.errors import DiskFull
from craft.models import Event, Session, SessionRepository
from craft.storage.db import db_sync_to_async
from sandboxes import services as sandbox_services
from sandboxes.catalog import Launch
from sandboxes.models import Sandbox
from sandboxes.signals import announce_change

# A session's repository in these states is not ready for a turn yet.
PREPARING = (
    SessionRepository.Status.PENDING,
    SessionRepository.Status.CLONING,
    SessionRepository.Status.SETTING_UP,
)


@db_sync_to_async
def prompt_seen(session_id: UUID, client_id: str) -> bool:
    """Return whether the session has stored a prompt with this client id."""
    return Event.objects.filter(session_id=session_id, client_id=client_id).exists()


# Why a turn was cut short when its sandbox was stopped (the `agent_error` and its reason).
STOPPED_BY_STAFF = "An administrator stopped this session's sandbox, so the turn was interrupted."
SANDBOX_STOPPED = "This session's sandbox was stopped, so the turn was interrupted."


@db_sync_to_async
def sandbox_status(session_id: UUID) -> str | None:
    return Sandbox.objects.filter(sessions__pk=session_id).values_list("status", flat=True).first()


@db_sync_to_async
def sandbox_for_prompt(session_id: UUID, *, keys: bool = False) -> tuple[str | None, bool, bool]:
    """Return the status of the sandbox the session's next turn runs in, whether the
    session was moved to it now, and whether its repository is still being cloned (or set
    up: the turn waits for it). With `keys` (a new prompt), first raise CredentialsMissing
    if the session's agent could not start for want of its owner's keys, and DiskFull if its
    sandbox is over its disk limit (nothing moves then).

    A session whose sandbox was terminated (by an administrator, by its owner, as idle) goes
    on in its owner's live sandbox, provisioned in the background if need be
    (`request_sandbox`): its log stays; its new agent starts in a new, empty workspace. A
    sleeping sandbox, or one whose folder or pod was found gone, is provisioned again on its
    files (`comes_back`); the second value is then True too: the turn waits for it.
    """
    session = Session.objects.select_related("sandbox", "owner", "repository").get(pk=session_id)
    if keys and (missing := credentials.missing_in(session)) is not None:
        raise missing
    cloning = is_cloning(session)
    if comes_back(session.sandbox):
        # Woken, or set up again on its files: the turn waits for it.
        sandbox = sandbox_services.request_sandbox(session.owner)
        return sandbox.status, True, cloning
    if session.sandbox.status != Sandbox.Status.TERMINATED:
        if keys and (full := sandbox_services.disk_refusal(session.sandbox_id)) is not None:
            raise DiskFull(full)
        return session.sandbox.status, False, cloning
    sandbox = sandbox_services.request_sandbox(session.owner)
    if sandbox.status == Sandbox.Status.TERMINATING:
        return sandbox.status, False, cloning  # its other sandbox is being stopped: not now
    Session.objects.filter(pk=session_id, sandbox=session.sandbox).update(sandbox=sandbox)
    # The new sandbox's own changes may have been announced while the session was still in
    # the old one: its pages read it again now that the session is there.
    announce_change(sandbox.pk, session.owner_id)
    return sandbox.status, True, cloning


def comes_back(sandbox: Sandbox) -> bool:
    """Return whether a turn brings the sandbox back itself: it sleeps, or its folder or pod
    was found gone (`sandbox_services.mark_gone`): provisioned again, its files are there
    (all of them where they live on a volume)."""
    return sandbox.status == Sandbox.Status.SLEEPING or (
        sandbox.status == Sandbox.Status.FAILED and sandbox.status_detail == "gone"
    )


@db_sync_to_async
def lost_with_its_sandbox(session_id: UUID) -> bool:
    """Say whether the session's sandbox was lost: its folder or pod found gone, before or
    now (then marked so). An agent that ended in a turn went with it, and did nothing after."""
    sandbox = Session.objects.select_related("sandbox").get(pk=session_id).sandbox
    if sandbox.status == Sandbox.Status.FAILED:
        return sandbox.status_detail == "gone"
    return sandbox.status == Sandbox.Status.RUNNING and sandbox_services.found_gone(
        sandbox, "found when its agent ended in a turn"
    )


@db_sync_to_async
def bring_back(session_id: UUID) -> bool:
    """Wake the session's sandbox, or set it up again if it was found gone (`comes_back`);
    return whether it is now on its way (provisioning), for a turn to wait for."""
    session = Session.objects.select_related("sandbox", "owner").get(pk=session_id)
    if not comes_back(session.sandbox):
        return False
    return sandbox_services.request_sandbox(session.owner).status == Sandbox.Status.PROVISIONING


def is_cloning(session: Session) -> bool:
    """Say whether the session's repository is still being cloned (or prepared)."""
    try:
        repository = session.repository
    except SessionRepository.DoesNotExist:
        return False
    return repository.status in PREPARING


@db_sync_to_async
def repository_preparing(session_id: UUID) -> bool:
    """Return whether the session's repository is still being cloned or set up."""
    return SessionRepository.objects.filter(session_id=session_id, status__in=PREPARING).exists()


@db_sync_to_async
def sandbox_stopped(session_id: UUID) -> tuple[str, str] | None:
    """Return why the session's turn was cut short, and its reason, if its sandbox is being
    (or was) stopped; None while it runs."""
    row = Sandbox.objects.filter(sessions__pk=session_id).values("status", "status_detail").first()
    if row is None or row["status"] not in (Sandbox.Status.TERMINATING, Sandbox.Status.TERMINATED):
        return None
    if row["status_detail"] == Sandbox.STOPPED_BY_STAFF:
        return STOPPED_BY_STAFF, "sandbox_stopped_by_staff"
    return SANDBOX_STOPPED, "sandbox_stopped"


class Start(NamedTuple):
    """What a session's agent starts with: its running sandbox, the agent session to
    reattach to (empty at the session's first start) and its launch (`credentials`)."""

    sandbox: Sandbox
    reattach: str
    launch: Launch


@db_sync_to_async
def start_of(session_id: UUID, *, wait: bool = False) -> Start | None:
    """Return what the session's agent starts with, its sandbox checked to be running, in
    one read. With `wait`, a sandbox still provisioning gives None (the caller asks again)
    rather than an error, and so does one that sleeps or was found gone, woken now. Raises
    SandboxUnavailable, then CredentialsMissing or SessionError (`credentials.launch_of`)."""
    session = Session.objects.select_related("sandbox", "owner").get(pk=session_id)
    sandbox = session.sandbox
    if wait and sandbox.status == Sandbox.Status.PROVISIONING:
        return None
    if wait and comes_back(sandbox):
        sandbox_services.request_sandbox(session.owner)  # it fell asleep since the prompt
        return None
    sandbox_services.check_running(sandbox.status, sandbox.error)
    return Start(sandbox, session.agent_session_id, credentials.launch_of(session))


@db_sync_to_async
def record_start(session_id: UUID, sandbox_id: UUID, agent_session_id: str | None) -> None:
    """Note the sandbox's activity and the agent's session id (what a restart reattaches to)."""
    sandbox_services.touch_sandbox(sandbox_id)
    if agent_session_id:
        Session.objects.filter(pk=session_id).exclude(agent_session_id=agent_session_id).update(
            agent_session_id=agent_session_id
        )
