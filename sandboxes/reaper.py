"""The reaper: stop what sits idle, re-claim what got stuck, remove what nobody owns.

Two passes, each safe to run in several processes at once (every change is a conditional
update or idempotent), each writing a `ReaperAction` for what it did:

* `stop_idle_agents` stops this process's agent connections that are in no turn and have no
  open permission request, and have not been used for `CRAFT_AGENT_IDLE_SECONDS`; and those
  of sandboxes that are no longer running (terminated, failed or gone, maybe by another
  process). Connections live in a server process's memory: only that process can do this.
  Warm agents (`sandboxes.warm_agents`) are reaped the same way, and those that died while waiting
  are replaced; a warm agent alone never keeps a sandbox from being idle.
* `reap_sandboxes`:
  - marks the sandboxes that hold live agent connections of this process as active now, so
    that every process (and `manage.py reap`) sees that they are in use;
  - re-claims sandboxes stuck in `provisioning` for `CRAFT_SANDBOX_PROVISIONING_TIMEOUT`
    (their server died or hung): they become `failed`, with a message, and the next session
    provisions them again;
  - terminates again sandboxes stuck in `terminating` for `CRAFT_SANDBOX_TERMINATING_TIMEOUT`;
  - puts idle running sandboxes to sleep, when `CRAFT_SANDBOX_SLEEP_SECONDS` is set, and
    terminates idle ones (running, sleeping or failed; their files go too), when
    `CRAFT_SANDBOX_IDLE_SECONDS` is set (`_idle`: no session activity, and no running turn,
    queued prompt, live agent or open terminal in any process for that long);
  - asks each backend in use for its inventory (folders and cgroups; pods and services by
    Craft's labels): what no live sandbox owns is removed (a cgroup's processes killed as
    one), and a running sandbox whose folder or pod is gone (checked again with a health
    check) is marked `failed`, so that the next session provisions it again;
  - measures the disk use of the running sandboxes used since their last measure (the
    local backend's, with `du` as the sandbox's user), and notes those over
    `CRAFT_SANDBOX_DISK`: their sessions take no new prompt;
  - forgets reaper actions older than `KEEP_ACTIONS`.

Nothing is done to a sandbox or session with a running turn (or, for sleeping and
terminating sandboxes, a queued prompt or an open terminal). Sessions, and so turns, belong
to the `craft` app, which this app never imports: it passes what the reaper needs to know as
a `Sessions` object.

Inside a server process, `periodic_reaper` runs the first pass every few seconds, with it
the warm sandboxes' pool (`sandboxes.warm.tend`: refilled, checked, surplus dropped), and the
second every `CRAFT_REAPER_INTERVAL_SECONDS`, on a thread of its own; `manage.py reap` runs
the second from outside.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol
from uuid import UUID

from django.conf import settings
from django.db import connections as db_connections
from django.utils import timezone

from . import services, warm
from .agent.connections import agent_connections
from .backends import Resource, SandboxError, get_backend
from .models import ReaperAction, Sandbox
from .signals import announce_change
from .terminals import terminals as open_terminals
from .warm_agents import warm_agents

logger = logging.getLogger(__name__)

AGENT_PASS_SECONDS = 5.0
KEEP_ACTIONS = timedelta(days=30)
Kind = ReaperAction.Kind


@dataclass(frozen=True)
class Busy:
    """Sessions with a running turn or a queued prompt (in any server process), and their
    sandboxes."""

    sessions: frozenset[UUID] = frozenset()
    sandboxes: frozenset[UUID] = frozenset()


class Sessions(Protocol):
    """What the app that owns sessions tells the reaper, read when the reaper asks."""

    def busy(self) -> Busy:
        """Return the sessions with a running turn (or an open permission request) or a
        queued prompt, and their sandboxes."""

    def last_activity(self, sandbox_ids: Collection[UUID]) -> dict[UUID, datetime]:
        """Return, per sandbox, the latest activity of its sessions (created, event stored)."""


@dataclass
class Report:
    actions: list[ReaperAction] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


# --- agents -------------------------------------------------------------------------------


def stop_idle_agents(sessions: Sessions) -> list[ReaperAction]:
    """Stop this process's idle agent connections, and those of sandboxes not running.

    Never one in a turn or with an open permission request: the connection itself says so
    (checked again under its lock), and so does `sessions` (a turn that is starting).
    """
    warm_agents.replace_dead()
    _close_terminals()
    keys = agent_connections.keys()
    if not keys:
        return []
    idle_seconds = settings.CRAFT_AGENT_IDLE_SECONDS
    doomed: dict[tuple[UUID, UUID], tuple[str, str, float]] = {}
    statuses = dict(
        Sandbox.objects.filter(pk__in={sandbox for sandbox, _ in keys})
        .exclude(status=Sandbox.Status.RUNNING)
        .values_list("pk", "status")
    )
    for key in keys:
        if key[0] in statuses:
            why = f"its sandbox is {statuses[key[0]]}"
            doomed[key] = (Kind.STOPPED_AGENT, why, 0.0)
    if idle_seconds > 0:
        for key in agent_connections.idle_keys(idle_seconds):
            why = f"no prompt for {_duration(idle_seconds)} (CRAFT_AGENT_IDLE_SECONDS)"
            doomed.setdefault(key, (Kind.STOPPED_IDLE_AGENT, why, idle_seconds))
    if not doomed:
        return []
    busy = sessions.busy()
    actions = []
    for (sandbox_id, session_id), (kind, why, idle) in doomed.items():
        if session_id in busy.sessions:
            continue
        warm = agent_connections.is_warm((sandbox_id, session_id))
        if agent_connections.stop_if_idle((sandbox_id, session_id), idle):
            target = "a warm agent" if warm else f"session {session_id}"
            logger.info("reaper: stopped the agent of %s: %s", target, why)
            actions.append(services.record_action(kind, why, sandbox_id=sandbox_id, target=target))
    return actions


def _close_terminals() -> None:
    """Close this process's terminals left without a socket for `terminals.DETACHED_SECONDS`,
    and those of sandboxes no longer running (terminated by another process)."""
    open_terminals.close_abandoned()
    open_in = open_terminals.sandboxes()
    if not open_in:
        return
    stopped = (
        Sandbox.objects.filter(pk__in=open_in)
        .exclude(status=Sandbox.Status.RUNNING)
        .values_list("pk", flat=True)
    )
    for sandbox_id in stopped:
        open_terminals.close_sandbox(sandbox_id)


# --- sandboxes ----------------------------------------------------------------------------


def reap_sandboxes(sessions: Sessions) -> Report:
    """Run the sandbox pass (see the module docstring); return what it did and what failed."""
    report = Report()
    now = timezone.now()
    for step in (
        _check_isolation,
        _mark_live_agents,
        _reclaim_provisioning,
        _retry_terminating,
        _sleep_idle,
        _terminate_idle,
        _sweep,
        _measure_disk,
        _forget_old_actions,
    ):
        try:
            step(sessions, now, report)
        except Exception as exc:
            logger.exception("reaper: %s failed", step.__name__.strip("_"))
            report.errors.append(f"{step.__name__.strip('_')}: {exc}")
    return report


def _check_isolation(sessions: Sessions, now: datetime, report: Report) -> None:
    """Put back the network rule or policy if someone removed it."""
    get_backend().check_isolation()


def _mark_live_agents(sessions: Sessions, now: datetime, report: Report) -> None:
    """Mark sandboxes with live agents or open terminals in this process as active now (for
    other processes)."""
    live = agent_connections.sandboxes() | open_terminals.sandboxes()
    if live:
        Sandbox.objects.filter(pk__in=live, last_activity_at__lt=now).update(last_activity_at=now)


def _stuck(sessions: Sessions, status: str, timeout: float, now: datetime) -> list[Sandbox]:
    """Return the sandboxes in `status` for more than `timeout` seconds that no session of
    this process is using."""
    stuck = Sandbox.objects.in_status_since(status, now - timedelta(seconds=timeout))
    busy = sessions.busy().sandboxes
    return [sandbox for sandbox in stuck if sandbox.pk not in busy]


def _reclaim_provisioning(sessions: Sessions, now: datetime, report: Report) -> None:
    timeout = settings.CRAFT_SANDBOX_PROVISIONING_TIMEOUT
    for sandbox in _stuck(sessions, Sandbox.Status.PROVISIONING, timeout, now):
        why = (
            f"Setting up the sandbox did not finish within {_duration(timeout)}: the server "
            "doing it may have stopped. A new session sets it up again."
        )
        reclaimed = Sandbox.objects.filter(
            pk=sandbox.pk,
            status=Sandbox.Status.PROVISIONING,
            status_changed_at=sandbox.status_changed_at,
        ).update(
            status=Sandbox.Status.FAILED, error=why, status_detail="stuck", status_changed_at=now
        )
        if reclaimed:
            announce_change(sandbox.pk, sandbox.owner_id)
            logger.warning("reaper: sandbox %s was stuck provisioning", sandbox.pk)
            report.actions.append(
                services.record_action(Kind.RECLAIMED_PROVISIONING, why, sandbox_id=sandbox.pk)
            )


def _retry_terminating(sessions: Sessions, now: datetime, report: Report) -> None:
    timeout = settings.CRAFT_SANDBOX_TERMINATING_TIMEOUT
    for sandbox in _stuck(sessions, Sandbox.Status.TERMINATING, timeout, now):
        sandbox = services.terminate_sandbox(sandbox)
        if sandbox.status == Sandbox.Status.TERMINATED:
            why = f"terminating for more than {_duration(timeout)}; terminated it again"
        else:
            why = f"terminating for more than {_duration(timeout)}; still failing: {sandbox.error}"
        action = _record_unless_repeated(Kind.RETRIED_TERMINATING, why, sandbox.pk)
        if action is not None:
            report.actions.append(action)


def _idle(
    sessions: Sessions, now: datetime, seconds: float, statuses: Collection[str]
) -> list[tuple[Sandbox, datetime]]:
    """Return the sandboxes in `statuses` unused for `seconds`, with since when: no session
    activity, and no running turn, queued prompt, live agent or open terminal (this
    process's, and those of other processes through `last_activity_at`, which their
    reapers keep marking, see `_mark_live_agents`)."""
    idle = timedelta(seconds=seconds)
    candidates = list(Sandbox.objects.filter(status__in=statuses, last_activity_at__lt=now - idle))
    if not candidates:
        return []
    activity = sessions.last_activity([sandbox.pk for sandbox in candidates])
    busy = sessions.busy().sandboxes
    return [
        (sandbox, sandbox.idle_since(activity.get(sandbox.pk)))
        for sandbox in candidates
        if sandbox.is_idle(now, idle, activity.get(sandbox.pk))
        and sandbox.pk not in busy
        and not agent_connections.count(sandbox.pk, warm=False)
        and sandbox.pk not in open_terminals.sandboxes()
    ]


def _sleep_idle(sessions: Sessions, now: datetime, report: Report) -> None:
    seconds = settings.CRAFT_SANDBOX_SLEEP_SECONDS
    if seconds <= 0:
        return
    for sandbox, since in _idle(sessions, now, seconds, [Sandbox.Status.RUNNING]):
        # Unless it was used since it was read, or work began meanwhile (`sleep_sandbox`).
        if not services.sleep_sandbox(
            sandbox, lambda: sessions.busy().sandboxes, idle_since=sandbox.last_activity_at
        ):
            continue
        why = (
            f"idle since {since:%Y-%m-%d %H:%M:%S} UTC: no session activity, running turn, "
            f"queued prompt, live agent or terminal for {_duration(seconds)} "
            "(CRAFT_SANDBOX_SLEEP_SECONDS); its files are kept"
        )
        logger.info("reaper: put idle sandbox %s to sleep", sandbox.pk)
        report.actions.append(services.record_action(Kind.SLEPT_IDLE, why, sandbox_id=sandbox.pk))


def _terminate_idle(sessions: Sessions, now: datetime, report: Report) -> None:
    seconds = settings.CRAFT_SANDBOX_IDLE_SECONDS
    if seconds <= 0:
        return
    # Each may hold a folder, a pod or a volume.
    holding = [Sandbox.Status.RUNNING, Sandbox.Status.FAILED, Sandbox.Status.SLEEPING]
    for sandbox, since in _idle(sessions, now, seconds, holding):
        # Claimed with a conditional update: a sandbox used since it was read is spared.
        claimed = Sandbox.objects.filter(
            pk=sandbox.pk, status=sandbox.status, last_activity_at=sandbox.last_activity_at
        ).update(
            status=Sandbox.Status.TERMINATING,
            status_detail=Sandbox.STOPPED_IDLE,
            status_changed_at=now,
        )
        if not claimed:
            continue
        announce_change(sandbox.pk, sandbox.owner_id)
        why = (
            f"idle since {since:%Y-%m-%d %H:%M:%S} UTC: no session activity, running turn, "
            f"queued prompt, live agent or terminal for {_duration(seconds)} "
            "(CRAFT_SANDBOX_IDLE_SECONDS); deleted with its files"
        )
        logger.info("reaper: terminating idle sandbox %s", sandbox.pk)
        sandbox = services.terminate_sandbox(sandbox)
        if sandbox.status != Sandbox.Status.TERMINATED:
            why += f"; terminating failed: {sandbox.error} (retried later)"
        report.actions.append(
            services.record_action(Kind.TERMINATED_IDLE, why, sandbox_id=sandbox.pk)
        )


def _sweep(sessions: Sessions, now: datetime, report: Report) -> None:
    """Remove what no live sandbox owns; mark running sandboxes whose resources are gone."""
    names = {settings.CRAFT_SANDBOX_BACKEND}
    names |= set(Sandbox.objects.live().values_list("backend", flat=True).distinct())
    for name in sorted(names):
        try:
            backend = get_backend(name)
            found = backend.inventory()
        except Exception as exc:
            logger.warning("reaper: cannot take the %s inventory: %s", name, exc)
            report.errors.append(f"{name} inventory: {exc}")
            continue
        # Read after the inventory: a sandbox's row is written before its resources, so
        # whatever the inventory saw that has no live row here has none for good. Warm
        # sandboxes first: a claim turns a warm row into a sandbox's row in one transaction,
        # so reading them in this order never misses both.
        pool = warm.warm_ids()
        live = dict(Sandbox.objects.live().values_list("pk", "status"))
        for resource in found:
            if resource.sandbox_id not in live and resource.sandbox_id not in pool:
                _remove_orphan(backend.remove, resource, report)
        present = {r.sandbox_id for r in found if r.kind in ("folder", "pod")}
        busy = sessions.busy().sandboxes
        missing = Sandbox.objects.filter(
            backend=name, status=Sandbox.Status.RUNNING, status_changed_at__lt=now
        ).exclude(pk__in=present | busy)
        for sandbox in missing:
            health = services.health_of(sandbox)  # the inventory may be stale: ask again
            if health is not None and health.gone:
                action = services.mark_gone(sandbox, health.detail, "found by the reaper")
                if action is not None:
                    report.actions.append(action)


def _measure_disk(sessions: Sessions, now: datetime, report: Report) -> None:
    """Measure the disk use of sandboxes used since their last measure, for at most half a
    pass's interval (the rest in the next passes); note which are over CRAFT_SANDBOX_DISK."""
    services.measure_disk(settings.CRAFT_REAPER_INTERVAL_SECONDS / 2)


def tend_warm_sandboxes() -> None:
    """Keep the pool of warm sandboxes full (`sandboxes.warm`), logging what it did."""
    try:
        for what in warm.tend():
            logger.info("reaper: %s", what)
    except Exception:
        logger.exception("reaper: tending the warm sandboxes failed")


def _remove_orphan(remove: Callable[[Resource], None], resource: Resource, report: Report) -> None:
    terminated = Sandbox.objects.filter(pk=resource.sandbox_id).exists()
    why = (
        "its sandbox is terminated"
        if terminated
        else "no sandbox of this site owns it (its row is gone)"
    )
    try:
        remove(resource)
    except SandboxError as exc:
        report.errors.append(f"removing {resource}: {exc}")
        return
    logger.warning("reaper: removed orphan %s: %s", resource, why)
    report.actions.append(
        services.record_action(
            Kind.REMOVED_ORPHAN,
            why,
            sandbox_id=resource.sandbox_id if terminated else None,
            target=str(resource),
        )
    )


def _forget_old_actions(sessions: Sessions, now: datetime, report: Report) -> None:
    ReaperAction.objects.filter(at__lt=now - KEEP_ACTIONS).delete()


def _record_unless_repeated(kind: str, why: str, sandbox_id: UUID) -> ReaperAction | None:
    """Record an action unless the sandbox's latest one says the same (a retry every pass)."""
    latest = ReaperAction.objects.filter(sandbox_id=sandbox_id).first()
    if latest is not None and (latest.kind, latest.reason) == (kind, why):
        return None
    return services.record_action(kind, why, sandbox_id=sandbox_id)


def _duration(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


# --- inside a server process --------------------------------------------------------------


class PeriodicReaper:
    """Run the reaper inside a server process: agents every few seconds, sandboxes every
    `CRAFT_REAPER_INTERVAL_SECONDS` (the first time a few seconds after the start).

    Passes run one at a time on a thread of their own, which hands its database connection
    back after each pass: they never hold up the event loop, the database threads or agent
    starts.
    """

    def __init__(self) -> None:
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="craft-reaper")

    async def run(self, sessions: Sessions) -> None:
        loop = asyncio.get_running_loop()
        next_sandbox_pass = loop.time()
        while True:
            await asyncio.sleep(AGENT_PASS_SECONDS)
            sandboxes_too = loop.time() >= next_sandbox_pass
            if sandboxes_too:
                next_sandbox_pass = loop.time() + settings.CRAFT_REAPER_INTERVAL_SECONDS
            try:
                await loop.run_in_executor(self._thread, self._pass, sessions, sandboxes_too)
            except Exception:
                logger.exception("reaping failed")

    @staticmethod
    def _pass(sessions: Sessions, sandboxes_too: bool) -> None:
        try:
            stop_idle_agents(sessions)
            tend_warm_sandboxes()
            if sandboxes_too:
                reap_sandboxes(sessions)
        finally:
            db_connections.close_all()


periodic_reaper = PeriodicReaper()
