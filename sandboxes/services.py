"""Every state change of a sandbox and its agent connections goes through these verbs.

They block (ORM, backend and process calls): async callers wrap them in `sync_to_async`.
The `craft` app uses this module, never the backends or the connection cache directly.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import socket
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db import connection as db_connection
from django.db.models import F, Q
from django.utils import timezone

from . import warm
from .agent.connection import AgentConnection
from .agent.connections import TooManyAgents, agent_connections
from .agent.protocol import AgentError
from .backends import Health, SandboxError, WarmUnusable, get_backend, warm_pool
from .backends.base import Previews
from .backends.budget import format_size
from .catalog import Launch, default_agent
from .models import ReaperAction, Sandbox
from .repository import Repository
from .runtime import runtime
from .signals import announce_change
from .terminals import terminals
from .warm_agents import warm_agents
from .workspace import Workspace

logger = logging.getLogger(__name__)


class SandboxUnavailable(SandboxError):
    """The sandbox is not running, so nothing can run in it."""


class ProvisioningStopped(SandboxError):
    """Raised by a provisioning's progress report once this process stops provisioning."""


def provision_sandbox(user: User) -> Sandbox:
    """Return the user's live sandbox, provisioned: created now, or the one there is.

    Single flight: concurrent calls for one user, in any server process, create one row (the
    partial unique constraint on owner makes a second insert fail, and the loser reads the
    winner's row), and only the caller that claims the row with a conditional update talks
    to the backend. The others wait for that provisioning to end, polling the row without
    holding a database connection. A provisioning that has not ended
    CRAFT_SANDBOX_PROVISIONING_TIMEOUT after it began is stuck (the server doing it died):
    a waiting caller takes it over. So a caller waits at most twice that timeout (a
    provisioning taken over just before its first deadline), then returns the row as it is.
    A failed sandbox is provisioned again (the retry path), and so is a running one whose
    folder or pod is found gone. Backend errors leave the sandbox `failed` with the error
    text; they are not raised.
    """
    timeout = settings.CRAFT_SANDBOX_PROVISIONING_TIMEOUT
    deadline = time.monotonic() + 2 * timeout
    pause = 0.02
    while True:
        sandbox = _get_or_create_row(user)
        claimed_at = _claim(sandbox, timeout)
        if claimed_at is not None:
            _run_provisioning(sandbox, claimed_at)
            sandbox.refresh_from_db()
            return sandbox
        if sandbox.status == Sandbox.Status.RUNNING:
            if found_gone(sandbox, "found when opening a session"):
                continue  # now failed: the next round provisions it again
            return sandbox
        if sandbox.status != Sandbox.Status.PROVISIONING or time.monotonic() >= deadline:
            return sandbox
        # Someone else provisions it: wait without holding one of the pool's connections.
        _release_database_connection()
        time.sleep(pause)
        pause = min(pause * 2, 0.5)


def request_sandbox(user: User) -> Sandbox:
    """Return the user's live sandbox at once; provision it in the background if it needs it.

    The twin of `provision_sandbox` for requests, which never wait on a pod: a new sandbox,
    a failed one (the retry), one stuck provisioning past CRAFT_SANDBOX_PROVISIONING_TIMEOUT
    and a running one whose folder or pod is found gone are claimed (the same single
    flight) and provisioned on a thread of this process, after the caller's transaction
    commits. The row comes back `provisioning`; its `status_detail` says how far it got, and
    `abandon_provisioning` marks it failed if this process stops first.
    """
    while True:
        sandbox = _get_or_create_row(user)
        claimed_at = _claim(sandbox, settings.CRAFT_SANDBOX_PROVISIONING_TIMEOUT)
        if claimed_at is not None:
            sandbox.refresh_from_db()
            transaction.on_commit(functools.partial(_provision_in_background, sandbox, claimed_at))
            return sandbox
        if sandbox.status == Sandbox.Status.RUNNING and found_gone(
            sandbox, "found when opening a session"
        ):
            continue  # now failed: the next round claims it
        return sandbox


@dataclass(frozen=True)
class _Provisioning:
    """A provisioning on a thread of this process: its claim's time, and how to stop it."""

    claimed_at: datetime
    thread: threading.Thread
    stop: threading.Event


# Sandboxes this process provisions in the background; at most PROVISIONING_THREADS talk to
# the backend at once (the others stay "queued").
PROVISIONING_THREADS = 8
_in_flight: dict[UUID, _Provisioning] = {}
_in_flight_lock = threading.Lock()
_provisioning_slots = threading.BoundedSemaphore(PROVISIONING_THREADS)


def _provision_in_background(sandbox: Sandbox, claimed_at: datetime) -> None:
    stop = threading.Event()

    def run() -> None:
        try:
            with _provisioning_slots:
                _run_provisioning(sandbox, claimed_at, stop)
        except Exception:
            logger.exception("provisioning sandbox %s failed", sandbox.pk)
        finally:
            with _in_flight_lock:
                _in_flight.pop(sandbox.pk, None)
            db_connection.close()

    # A daemon thread: a process that stops does not wait minutes for a pod; what it leaves
    # half done, `abandon_provisioning` marks failed (or the reaper, after a kill). A server
    # that stops cleanly stops it first (`stop_provisioning`).
    thread = threading.Thread(target=run, name=f"provision-{sandbox.pk}", daemon=True)
    with _in_flight_lock:
        _in_flight[sandbox.pk] = _Provisioning(claimed_at, thread, stop)
    thread.start()


def stop_provisioning(timeout: float) -> int:
    """Stop this process's provisionings (it is stopping, after `abandon_provisioning`) and
    wait up to `timeout` seconds for their threads to end; return how many still run then.

    Each one stops at its backend's next progress report (at least one per poll), so within
    one call of the backend. Why wait: a provisioning thread is a daemon thread, and one
    still inside the kubernetes client when the interpreter finalizes kills the process.
    CPython before 3.14 ends a daemon thread that wakes during finalization with
    pthread_exit (python/cpython#87135), whose forced unwinding aborts the process (SIGABRT)
    when it meets a Rust frame; the kubernetes client (37) runs every API call inside
    pydantic's `validate_call` (pydantic-core, Rust). See PyO3/pyo3#4874.
    """
    with _in_flight_lock:
        running = list(_in_flight.values())
    for provisioning in running:
        provisioning.stop.set()
    deadline = time.monotonic() + timeout
    for provisioning in running:
        provisioning.thread.join(max(0.0, deadline - time.monotonic()))
    return sum(provisioning.thread.is_alive() for provisioning in running)


def provisioning_left() -> int:
    """How many of this process's provisioning threads still run (inside the backend, after
    `stop_provisioning` gave up on them)."""
    with _in_flight_lock:
        return sum(provisioning.thread.is_alive() for provisioning in _in_flight.values())


def abandon_provisioning() -> int:
    """Mark the sandboxes this process is provisioning failed (it is stopping); return how
    many. The user's next session, or "Try again", provisions them anew."""
    with _in_flight_lock:
        claims = [(pk, provisioning.claimed_at) for pk, provisioning in _in_flight.items()]
    abandoned = 0
    for sandbox_id, claimed_at in claims:
        ours = Sandbox.objects.filter(
            pk=sandbox_id, status=Sandbox.Status.PROVISIONING, status_changed_at=claimed_at
        )
        owner_id = ours.values_list("owner_id", flat=True).first()
        if ours.update(
            status=Sandbox.Status.FAILED,
            error="The server restarted while it was setting up your sandbox. Try again.",
            status_detail="interrupted",
            status_changed_at=timezone.now(),
        ):
            abandoned += 1
            announce_change(sandbox_id, owner_id)
    return abandoned


def _get_or_create_row(user: User) -> Sandbox:
    """Return the user's live sandbox row, creating it if there is none.

    A new row takes a warm sandbox if the pool has a ready one (`warm.take`, in the same
    transaction): it gets the warm sandbox's id, and its provisioning claims that pod.
    """
    existing = Sandbox.objects.live().owned_by(user).first()
    if existing is not None:
        return existing
    backend = settings.CRAFT_SANDBOX_BACKEND
    try:
        with transaction.atomic():
            warm_id = warm.take(backend)
            sandbox = Sandbox.objects.create(
                owner=user,
                backend=backend,
                status=Sandbox.Status.PROVISIONING,
                status_detail="claiming a warm sandbox" if warm_id else "queued",
                **({"id": warm_id} if warm_id else {}),
            )
    except IntegrityError:
        return Sandbox.objects.live().owned_by(user).get()
    sandbox._created = True  # type: ignore[attr-defined]
    sandbox._warm = warm_id is not None  # type: ignore[attr-defined]
    announce_change(sandbox.pk, user.pk)
    return sandbox


def _claim(sandbox: Sandbox, timeout: float) -> datetime | None:
    """Claim the sandbox's provisioning for this caller; return the claim's time, or None.

    A new row is ours; a failed one, a sleeping one (the wake), or one stuck in provisioning
    (or falling asleep) for `timeout` seconds, is ours if our conditional update is the one
    that changes it. The claim's time (the row's
    `status_changed_at`) is what this caller's later writes are conditional on, so a claim
    that was taken over never overwrites its successor.
    """
    if getattr(sandbox, "_created", False):
        return sandbox.status_changed_at
    now = timezone.now()
    stuck_since = now - timedelta(seconds=timeout)
    if sandbox.status in (Sandbox.Status.FAILED, Sandbox.Status.SLEEPING):
        # A failed sandbox is retried; a sleeping one wakes: provisioned again on its files,
        # once it is asleep (not while `sleep_sandbox` still stops it, unless that got stuck).
        waking = sandbox.status == Sandbox.Status.SLEEPING
        asleep = ~Q(status_detail=Sandbox.FALLING_ASLEEP) | Q(status_changed_at__lt=stuck_since)
        claimed = (
            Sandbox.objects.filter(pk=sandbox.pk, status=sandbox.status)
            .filter(asleep)
            .update(
                status=Sandbox.Status.PROVISIONING,
                error="",
                status_detail=Sandbox.WAKING if waking else "retrying",
                status_changed_at=now,
            )
        )
        if not claimed:
            return None
        announce_change(sandbox.pk, sandbox.owner_id)
        return now
    if sandbox.status == Sandbox.Status.PROVISIONING and sandbox.status_changed_at < stuck_since:
        claimed = Sandbox.objects.filter(
            pk=sandbox.pk,
            status=Sandbox.Status.PROVISIONING,
            status_changed_at=sandbox.status_changed_at,
        ).update(status_detail="retrying", status_changed_at=now)
        if claimed:
            announce_change(sandbox.pk, sandbox.owner_id)
            record_action(
                ReaperAction.Kind.RECLAIMED_PROVISIONING,
                f"provisioning had not finished after {timeout:g} s; provisioning it again",
                sandbox_id=sandbox.pk,
            )
            return now
    return None


def _run_provisioning(
    sandbox: Sandbox, claimed_at: datetime, stop: threading.Event | None = None
) -> None:
    """Provision `sandbox` under its claim made at `claimed_at`; stop at the backend's next
    progress report once `stop` is set."""
    if stop is not None and stop.is_set():
        return  # stopped while it waited for a slot
    backend = get_backend(sandbox.backend)
    ours = Sandbox.objects.filter(
        pk=sandbox.pk, status=Sandbox.Status.PROVISIONING, status_changed_at=claimed_at
    )

    def update(**fields: Any) -> None:
        if ours.update(**fields):
            announce_change(sandbox.pk, sandbox.owner_id)

    shown = [""]
    # A sleeping sandbox's steps say that it wakes (the page says "Waking your sandbox").
    waking = Sandbox.objects.filter(pk=sandbox.pk, status_detail=Sandbox.WAKING).exists()

    def progress(detail: str) -> None:
        if stop is not None and stop.is_set():
            raise ProvisioningStopped("this server stopped provisioning")
        if detail != shown[0]:  # reported at every poll; written when it changes
            shown[0] = detail
            update(status_detail=(f"{Sandbox.WAKING}: {detail}" if waking else detail)[:500])

    try:
        reference = _claim_warm(sandbox, progress) or backend.provision(sandbox, progress)
    except ProvisioningStopped:
        return  # `abandon_provisioning` said so to its user
    except Exception as exc:
        logger.warning("provisioning sandbox %s failed: %s", sandbox.pk, exc)
        update(
            status=Sandbox.Status.FAILED,
            error=str(exc) or exc.__class__.__name__,
            status_changed_at=timezone.now(),
        )
        return
    now = timezone.now()
    update(
        status=Sandbox.Status.RUNNING,
        reference=reference,
        status_detail="ready",
        error="",
        status_changed_at=now,
        last_activity_at=now,
    )
    sandbox.reference = reference
    if stop is None or not stop.is_set():  # no agent started by a server that is stopping
        warm_agents.sandbox_ready(sandbox)


def _claim_warm(sandbox: Sandbox, progress: Any) -> str:
    """Claim the warm sandbox this new sandbox took; return its reference, or "" when it did
    not take one or the pod turned out unusable (dropped: provision a fresh one)."""
    pool = warm_pool(get_backend(sandbox.backend))
    if not getattr(sandbox, "_warm", False) or pool is None:
        return ""
    try:
        return pool.claim_warm(sandbox, progress)
    except WarmUnusable as exc:
        logger.warning("sandbox %s: %s; starting a fresh pod", sandbox.pk, exc)
        progress("the warm pod was not usable; starting a new one")
        return ""


def _release_database_connection() -> None:
    """Hand this thread's database connection back (to the pool) while it waits or blocks.

    Not inside a transaction, which needs its connection (tests run in one).
    """
    if not db_connection.in_atomic_block:
        db_connection.close()


def mark_gone(sandbox: Sandbox, detail: str, found_by: str) -> ReaperAction | None:
    """Mark a running sandbox whose folder or pod is gone `failed`; return the recorded
    action, or None when it was not running (any more).

    The error says what happened and what to do, in words fit for its user. The sandbox's
    agent connections in this process are stopped (their agents lost their sandbox), and the
    next session provisions it again.
    """
    now = timezone.now()
    message = f"{_sentence(detail)} ({found_by}). Your next message sets the sandbox up again."
    changed = Sandbox.objects.filter(pk=sandbox.pk, status=Sandbox.Status.RUNNING).update(
        status=Sandbox.Status.FAILED,
        error=message,
        status_detail="gone",
        status_changed_at=now,
    )
    if not changed:
        return None
    announce_change(sandbox.pk, sandbox.owner_id)
    logger.warning("sandbox %s is gone: %s", sandbox.pk, message)
    action = record_action(ReaperAction.Kind.MARKED_GONE, message, sandbox_id=sandbox.pk)
    agent_connections.stop_sandbox(sandbox.pk)
    return action


def _sentence(text: str) -> str:
    text = text.strip().rstrip(".")
    return text[:1].upper() + text[1:]


def health_of(sandbox: Sandbox) -> Health | None:
    """Ask the backend about the sandbox now; None when it cannot tell (an API error)."""
    try:
        return get_backend(sandbox.backend).health(sandbox)
    except Exception as exc:
        logger.warning("health check of sandbox %s failed: %s", sandbox.pk, exc)
        return None


def found_gone(sandbox: Sandbox, found_by: str) -> bool:
    """Check a sandbox that failed us (`found_by` says how, for its error): if its folder or
    pod is gone, mark it failed (`mark_gone`) and return True."""
    health = health_of(sandbox)
    if health is None or not health.gone:
        return False
    mark_gone(sandbox, health.detail, found_by)
    return True


def terminate_sandbox(sandbox: Sandbox, *, by_staff: bool = False) -> Sandbox:
    """Stop every agent connection of the sandbox, free its resources, mark it terminated.

    Idempotent. Resources already gone count as freed; if the backend fails, the sandbox stays
    `terminating` with the error, and calling this again retries. `by_staff` (the admin's
    action) leaves `Sandbox.STOPPED_BY_STAFF` as its detail, written before any agent is
    stopped: a turn cut short by it can tell its user who stopped the sandbox. A reason the
    caller wrote when it claimed the sandbox (`Sandbox.STOP_REASONS`: the reaper's
    `STOPPED_IDLE`) stays the detail once it is terminated, so the page can say why.
    """
    if (
        Sandbox.objects.filter(pk=sandbox.pk)
        .exclude(status__in=[Sandbox.Status.TERMINATED, Sandbox.Status.TERMINATING])
        .update(
            status=Sandbox.Status.TERMINATING,
            status_detail=Sandbox.STOPPED_BY_STAFF if by_staff else "terminating",
            status_changed_at=timezone.now(),
        )
    ):
        announce_change(sandbox.pk, sandbox.owner_id)
    sandbox.refresh_from_db()
    if sandbox.status == Sandbox.Status.TERMINATED:
        return sandbox
    stopped = agent_connections.stop_sandbox(sandbox.pk)
    closed = terminals.close_sandbox(sandbox.pk)
    logger.info(
        "terminating sandbox %s: stopped %d agent connection(s), closed %d terminal(s)",
        sandbox.pk, stopped, closed,
    )  # fmt: skip
    try:
        get_backend(sandbox.backend).terminate(sandbox)
    except Exception as exc:
        Sandbox.objects.filter(pk=sandbox.pk).update(error=f"terminate failed: {exc}")
        announce_change(sandbox.pk, sandbox.owner_id)
        sandbox.refresh_from_db()
        return sandbox
    now = timezone.now()
    reason = sandbox.status_detail
    Sandbox.objects.filter(pk=sandbox.pk).update(
        status=Sandbox.Status.TERMINATED,
        status_detail=reason if reason in Sandbox.STOP_REASONS else "terminated",
        status_changed_at=now,
        terminated_at=now,
    )
    announce_change(sandbox.pk, sandbox.owner_id)
    sandbox.refresh_from_db()
    return sandbox


def sleep_sandbox(
    sandbox: Sandbox,
    busy: Callable[[], Collection[UUID]],
    *,
    by_staff: bool = False,
    idle_since: datetime | None = None,
) -> bool:
    """Put a running sandbox to sleep; return whether it went.

    Its agents and terminals in this process are stopped, and the backend stops the rest
    and frees what the sandbox costs idle (its pod), keeping its files; other processes
    stop their agents of it at their next agent pass (it is not running). The next prompt,
    or opening its files, wakes it (`_claim`: provisioned again).

    Never while it works: the claim is a conditional update (still running, and with
    `idle_since`, not used since), and after it `busy()` (the sandboxes with a running turn
    or a queued prompt, in any process) and this process's agents are asked again: a turn
    stored in between, or an agent in a turn here, wakes it back at once. A turn that
    starts after the claim finds the sandbox sleeping and wakes it itself. An agent that is
    only started (a page asking for its pickers) is no work: it is stopped with the others,
    even if its start ended just now.
    """
    now = timezone.now()
    mine = Sandbox.objects.filter(pk=sandbox.pk, status=Sandbox.Status.RUNNING)
    if idle_since is not None:
        mine = mine.filter(last_activity_at=idle_since)
    detail = Sandbox.ASLEEP_BY_STAFF if by_staff else Sandbox.ASLEEP_IDLE
    falling = {"status_detail": Sandbox.FALLING_ASLEEP, "status_changed_at": now}
    if not mine.update(status=Sandbox.Status.SLEEPING, **falling):
        return False
    agent_connections.stop_idle(sandbox.pk, 0.0)
    if sandbox.pk in busy() or agent_connections.in_turn(sandbox.pk):
        Sandbox.objects.filter(
            pk=sandbox.pk, status=Sandbox.Status.SLEEPING, status_changed_at=now
        ).update(status=Sandbox.Status.RUNNING, status_detail="ready", status_changed_at=now)
        return False
    announce_change(sandbox.pk, sandbox.owner_id)
    agent_connections.stop_sandbox(sandbox.pk)  # a warm agent too
    terminals.close_sandbox(sandbox.pk)
    try:
        get_backend(sandbox.backend).sleep(sandbox)
    except Exception as exc:
        # What was not stopped is adopted by the wake (`provision` is idempotent).
        logger.warning("putting sandbox %s to sleep failed: %s", sandbox.pk, exc)
        Sandbox.objects.filter(pk=sandbox.pk).update(error=f"sleep failed: {exc}")
    # Asleep: from now on a prompt (or staff) can wake it.
    Sandbox.objects.filter(pk=sandbox.pk, status=Sandbox.Status.SLEEPING, **falling).update(
        status_detail=detail
    )
    announce_change(sandbox.pk, sandbox.owner_id)
    logger.info("sandbox %s is asleep (%s)", sandbox.pk, detail)
    return True


def terminate_before_delete(sender: type[Sandbox], instance: Sandbox, **kwargs: Any) -> None:
    """Terminate a sandbox whose row is being deleted (the admin, a deleted user), so that
    no agent, folder or pod outlives it. Resources a failing backend leaves behind have no
    row any more: the reaper removes them as orphans."""
    if instance.status != Sandbox.Status.TERMINATED:
        terminate_sandbox(instance)


def require_running(sandbox: Sandbox) -> None:
    """Raise SandboxUnavailable unless the sandbox is running now (read from the database)."""
    row = Sandbox.objects.filter(pk=sandbox.pk).values("status", "error").first()
    if row is None:
        raise SandboxUnavailable("your sandbox is gone")
    check_running(row["status"], row["error"])


def check_running(status: str, error: str) -> None:
    """Raise SandboxUnavailable unless `status`, a sandbox's as the caller just read it, is
    running; `error` says why it failed."""
    if status != Sandbox.Status.RUNNING:
        why = f": {error}" if error else ""
        raise SandboxUnavailable(f"your sandbox is {status}{why}")


def workspace_path(sandbox: Sandbox, session_id: UUID) -> str:
    """Return the session's workspace as its agent sees it (its working directory)."""
    return get_backend(sandbox.backend).workspace_path(sandbox, session_id)


def session_workspace(sandbox: Sandbox, session_id: UUID, *, just_read: bool = False) -> Workspace:
    """Return the session's workspace, to list and download (`sandboxes.workspace`).

    Raises SandboxUnavailable unless the sandbox is running: its files are read where its
    agents run, with their rights. Its status is read from the database again, unless the
    caller `just_read` the row it passes.
    """
    if just_read:
        check_running(sandbox.status, sandbox.error)
    else:
        require_running(sandbox)
    return get_backend(sandbox.backend).workspace(sandbox, session_id)


def writable_workspace(sandbox: Sandbox, session_id: UUID) -> Workspace:
    """Return the session's workspace to write into (an upload), made first if its agent has
    not started yet. Raises SandboxUnavailable unless the sandbox is running."""
    require_running(sandbox)
    backend = get_backend(sandbox.backend)
    backend.make_workspace(sandbox, session_id)
    return backend.workspace(sandbox, session_id)


def session_repository(sandbox: Sandbox, session_id: UUID) -> Repository:
    """Return the session's workspace as a git repository (`sandboxes.repository`): Craft's
    own git, run where its agents run. The caller checked that the sandbox runs."""
    return get_backend(sandbox.backend).repository(sandbox, session_id)


def _previews(sandbox: Sandbox) -> Previews:
    backend = get_backend(sandbox.backend)
    if not isinstance(backend, Previews):
        raise SandboxError(f"the {backend.name} backend has no previews")
    return backend


def preview_ports(sandbox: Sandbox) -> list[int]:
    """Return the TCP ports the sandbox's processes listen on (docs/workbench.md). Raises
    SandboxUnavailable unless the sandbox is running (read from the database again)."""
    require_running(sandbox)
    return _previews(sandbox).listening_ports(sandbox)


def preview_connect(sandbox: Sandbox, port: int, timeout: float) -> socket.socket:
    """Return a blocking socket connected to `port` in the sandbox, whose status the caller
    just read (`check_running`); SandboxError says why not."""
    check_running(sandbox.status, sandbox.error)
    return _previews(sandbox).preview_connect(sandbox, port, timeout)


def remove_session_workspace(sandbox: Sandbox, session_id: UUID) -> None:
    """Stop the session's agent connection (if any), close its terminals (this process's)
    and remove its workspace; the sandbox's disk use is measured again at the reaper's next
    pass."""
    agent_connections.stop_session(sandbox.pk, session_id)
    terminals.close_session(sandbox.pk, session_id)
    if sandbox.status in (Sandbox.Status.RUNNING, Sandbox.Status.FAILED):
        get_backend(sandbox.backend).remove_workspace(sandbox, session_id)
        Sandbox.objects.filter(pk=sandbox.pk).update(disk_measured_at=None)


# --- disk use -------------------------------------------------------------------------------

# This process's view of the sandboxes over CRAFT_SANDBOX_DISK (id: bytes), as of its last
# reaper pass: prompts are checked against it without a query.
_over_disk: dict[UUID, int] = {}


def measure_disk(seconds: float) -> int:
    """Measure the disk use of the running sandboxes not measured since their last activity,
    least recently measured first, for about `seconds` at most; then read which sandboxes
    are over CRAFT_SANDBOX_DISK into this process's view. Return how many were measured.

    Each measure is claimed by a conditional update of `disk_measured_at` (to the time it
    starts, so that activity during it brings another), so that server processes reaping at
    once never measure one sandbox twice.
    """
    deadline = time.monotonic() + seconds
    due = (
        Sandbox.objects.filter(status=Sandbox.Status.RUNNING)
        .filter(Q(disk_measured_at=None) | Q(disk_measured_at__lt=F("last_activity_at")))
        .order_by(F("disk_measured_at").asc(nulls_first=True))
    )
    measured = 0
    for sandbox in due[:MEASURES_PER_PASS]:
        if time.monotonic() > deadline:
            break
        start = timezone.now()
        claimed = Sandbox.objects.filter(
            pk=sandbox.pk, disk_measured_at=sandbox.disk_measured_at
        ).update(disk_measured_at=start)
        if not claimed:
            continue  # another process measures it
        used = get_backend(sandbox.backend).disk_usage(sandbox)
        if used is not None:
            Sandbox.objects.filter(pk=sandbox.pk).update(disk_bytes=used)
        measured += 1
    read_disk_use()
    return measured


# At most so many sandboxes are measured in one pass (the rest, in the next ones).
MEASURES_PER_PASS = 500


def read_disk_use() -> None:
    """Read which live sandboxes are over CRAFT_SANDBOX_DISK into this process's view."""
    global _over_disk
    limit = settings.CRAFT_SANDBOX_DISK
    over = Sandbox.objects.live().filter(disk_bytes__gt=limit) if limit else Sandbox.objects.none()
    _over_disk = {pk: used or 0 for pk, used in over.values_list("pk", "disk_bytes")}


def disk_refusal(sandbox_id: UUID | None) -> str | None:
    """Return why a new prompt is refused in the sandbox (its files take more disk than
    CRAFT_SANDBOX_DISK, as last measured), in words for its owner; None when it is not."""
    limit = settings.CRAFT_SANDBOX_DISK
    used = _over_disk.get(sandbox_id) if sandbox_id is not None else None
    if not limit or used is None or used <= limit:
        return None
    interval = settings.CRAFT_REAPER_INTERVAL_SECONDS
    again = f"{interval / 60:g} min" if interval >= 60 else f"{interval:g} s"
    return (
        f"Your sandbox's files take {format_size(used)} of disk, over its limit of "
        f"{format_size(limit)}, so the agent takes no new message; nothing was deleted. Free "
        "space by deleting sessions you no longer need (their files go with them): the disk "
        f"is measured again within {again}."
    )


def connect_agent(
    sandbox: Sandbox,
    session_id: UUID,
    reattach: str | None = None,
    launch: Launch | None = None,
) -> AgentConnection:
    """Return the session's cached agent connection, starting the agent if there is none.

    The first call starts the agent in the session's workspace and opens its ACP session;
    later calls return the same connection while its process lives, or a new one if it died.
    A new agent is asked to continue the agent session `reattach` if given (see
    `AgentConnection.start`). `launch` is the session's agent with its owner's credentials
    (default: the catalog's first agent, without any). Raises SandboxUnavailable unless the
    sandbox is running.
    """
    require_running(sandbox)
    connection = agent_connection(sandbox, session_id, reattach, launch)
    touch_sandbox(sandbox.pk)
    return connection


def agent_connection(
    sandbox: Sandbox,
    session_id: UUID,
    reattach: str | None = None,
    launch: Launch | None = None,
) -> AgentConnection:
    """Like `connect_agent`, for a sandbox the caller has just seen running.

    It does no database work on the way (it can block for an agent's start, seconds on
    Kubernetes, without holding a database connection). Only when the start fails does it
    check the sandbox: if its folder or pod is gone, the sandbox is marked failed and
    SandboxUnavailable says so in words fit for the user.
    """
    launch = launch or Launch(default_agent())
    # A warm agent opens a new session, or continues the session's earlier one (`reattach`):
    # either way its `cwd` is named in the request, as ACP has it.
    warm = warm_agents.enabled()
    try:
        connection = agent_connections.get_or_start(
            sandbox.pk,
            session_id,
            lambda: start_agent_connection(sandbox, session_id, reattach, launch),
            adopt=(
                functools.partial(adopt_warm_agent, sandbox, session_id, reattach) if warm else None
            ),
            launch=launch,
        )
    except TooManyAgents:
        raise  # the server is full, the sandbox is fine
    except (SandboxError, AgentError) as exc:
        # Outside the cache's lock: marking the sandbox gone stops its connections.
        gone = found_gone(sandbox, "found when starting an agent")
        if gone:
            row = Sandbox.objects.filter(pk=sandbox.pk).values_list("error", flat=True).first()
            _release_database_connection()
            raise SandboxUnavailable(row or "your sandbox is gone") from exc
        _release_database_connection()
        raise
    warm_agents.want(sandbox, launch)
    return connection


def adopt_warm_agent(
    sandbox: Sandbox, session_id: UUID, reattach: str | None, warm: AgentConnection
) -> AgentConnection:
    """Open the session on a warm agent (`sandboxes.warm_agents`): its workspace is made, and
    `session/new` names it as the session's `cwd`; or, with `reattach`, the agent continues
    that earlier session of the workspace (`session/resume` or `session/load`, as a cold
    start would: see `AgentConnection.start`)."""
    backend = get_backend(sandbox.backend)
    backend.make_workspace(sandbox, session_id)
    warm.open_session(
        settings.CRAFT_AGENT_START_TIMEOUT,
        reattach=reattach,
        cwd=backend.workspace_path(sandbox, session_id),
    )
    logger.info("session %s took warm agent %s", session_id, warm.process.ident)
    return warm


def start_agent_connection(
    sandbox: Sandbox,
    session_id: UUID,
    reattach: str | None = None,
    launch: Launch | None = None,
) -> AgentConnection:
    """Start the agent in the session's workspace and open its ACP session (uncached).

    The workspace is the same folder every time, so an agent that keeps its sessions there
    can continue the agent session `reattach` (see `AgentConnection.start`). A start waits for
    one of the backend's `start_slots` (CRAFT_LOCAL_AGENT_STARTS on the local backend).
    """
    backend = get_backend(sandbox.backend)
    with backend.start_slots or contextlib.nullcontext():
        process = backend.start_agent(sandbox, session_id, launch)
        connection = AgentConnection(
            process,
            cwd=backend.workspace_path(sandbox, session_id),
            max_message_bytes=settings.CRAFT_MAX_MESSAGE_BYTES,
            max_terminal_bytes=settings.CRAFT_MAX_TERMINAL_OUTPUT_BYTES,
            credentials=launch.agent.credentials if launch else (),
        )
        agent_connections.starting(sandbox.pk, session_id, connection)
        connection.start(timeout=settings.CRAFT_AGENT_START_TIMEOUT, reattach=reattach)
    logger.info(
        "started agent %s for session %s (restored: %s)",
        process.ident, session_id, connection.restored or "first start",
    )  # fmt: skip
    return connection


def touch_sandbox(sandbox_id: UUID) -> None:
    """Record that the sandbox is in use now (its idle time starts again)."""
    Sandbox.objects.filter(pk=sandbox_id).update(last_activity_at=timezone.now())


def stop_idle_connections(sandbox: Sandbox | None = None, idle_seconds: float = 0.0) -> int:
    """Stop agent connections without a running turn (of one sandbox, or all)."""
    return agent_connections.stop_idle(sandbox.pk if sandbox else None, idle_seconds)


def stop_all_agents() -> int:
    """Stop every agent connection of this process, all at once, and start no more warm
    agents (the process is stopping); return how many."""
    return runtime.stop()


def live_connection_count(sandbox_id: UUID | None = None) -> int:
    return agent_connections.count(sandbox_id)


def record_action(
    kind: str, reason: str, *, sandbox_id: UUID | None = None, target: str = ""
) -> ReaperAction:
    """Write down something Craft did on its own, for the inventory."""
    action = ReaperAction(kind=kind, reason=reason, sandbox_id=sandbox_id, target=target[:255])
    try:
        with transaction.atomic():
            action.save()
    except IntegrityError:  # the sandbox's row was deleted meanwhile
        action.sandbox_id = None
        action.save()
    return action
