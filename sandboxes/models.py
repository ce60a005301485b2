"""The sandbox: where one user's agents run, and its lifecycle."""

import uuid
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.db import models
from django.db.models import Q
from django.utils import timezone


class SandboxQuerySet(models.QuerySet["Sandbox"]):
    def live(self) -> "SandboxQuerySet":
        """Return sandboxes that hold (or are getting) resources: not terminated."""
        return self.exclude(status=Sandbox.Status.TERMINATED)

    def owned_by(self, user: User | AnonymousUser) -> "SandboxQuerySet":
        return self.filter(owner=user)

    def in_status_since(self, status: str, before: datetime) -> "SandboxQuerySet":
        """Return sandboxes that entered `status` before `before` and are still in it."""
        return self.filter(status=status, status_changed_at__lt=before)


class Sandbox(models.Model):
    """One user's isolated place to run agents: a folder (local) or a pod (kubernetes).

    Lifecycle: provisioning -> running -> terminating -> terminated, and failed from
    provisioning or when its folder or pod is found gone (a failed sandbox is provisioned
    again). A running sandbox left idle goes to sleep (`sleeping`: its agents stopped, its
    pod deleted, its files kept) and wakes by being provisioned again. Each user has at most
    one sandbox that is not terminated; terminated ones stay as the inventory's history.
    `status_changed_at` says since when it is in its status, so that one stuck in
    provisioning or terminating can be told from one that is merely slow.
    """

    class Status(models.TextChoices):
        PROVISIONING = "provisioning"
        RUNNING = "running"
        TERMINATING = "terminating"
        TERMINATED = "terminated"
        FAILED = "failed"
        SLEEPING = "sleeping"

    # The `status_detail` of a sandbox that staff terminated (the admin's action), so that
    # its user can be told who stopped it.
    STOPPED_BY_STAFF = "stopped by an administrator"
    # ...and when the reaper terminated it for sitting idle (CRAFT_SANDBOX_IDLE_SECONDS).
    STOPPED_IDLE = "stopped after being idle"
    # The details that say why a sandbox stopped: kept from `terminating` to `terminated`.
    STOP_REASONS = (STOPPED_BY_STAFF, STOPPED_IDLE)
    # The `status_detail` of a sleeping sandbox: put to sleep by the reaper
    # (CRAFT_SANDBOX_SLEEP_SECONDS) or by staff (the admin's action); and of one waking up.
    ASLEEP_IDLE = "asleep after being idle"
    ASLEEP_BY_STAFF = "put to sleep by an administrator"
    # ...while its agents are stopped and its pod deleted: it wakes only once that is done.
    FALLING_ASLEEP = "falling asleep"
    WAKING = "waking"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sandboxes"
    )
    backend = models.CharField(max_length=32)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PROVISIONING)
    # What the backend calls it: a folder path, a pod name.
    reference = models.CharField(max_length=255, blank=True)
    # Progress the page shows while provisioning (pod phase, latest event).
    status_detail = models.CharField(max_length=500, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    status_changed_at = models.DateTimeField(default=timezone.now)
    # Last use: an agent started or prompted, a session created, or (written by each server
    # process's reaper) a live agent connection in some server process.
    last_activity_at = models.DateTimeField(default=timezone.now)
    terminated_at = models.DateTimeField(null=True, blank=True)
    # What its files take on disk (its folder or volume, with its checkpoint stores), as the
    # reaper last measured it, and when; empty where the backend cannot tell.
    disk_bytes = models.BigIntegerField(null=True, blank=True)
    disk_measured_at = models.DateTimeField(null=True, blank=True)

    objects = SandboxQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        verbose_name_plural = "sandboxes"
        constraints = [
            models.UniqueConstraint(
                fields=["owner"],
                condition=~Q(status="terminated"),
                name="one_live_sandbox_per_owner",
            )
        ]

    def __str__(self) -> str:
        return f"{self.owner} / {self.backend} / {self.status}"

    @property
    def is_running(self) -> bool:
        return self.status == self.Status.RUNNING

    def age(self, now: datetime | None = None) -> timedelta:
        return (now or timezone.now()) - self.created_at

    def idle_since(self, session_activity: datetime | None = None) -> datetime:
        """Return when the sandbox was last in use: its own activity or its sessions' latest."""
        if session_activity is None:
            return self.last_activity_at
        return max(self.last_activity_at, session_activity)

    def is_idle(
        self, now: datetime, idle: timedelta, session_activity: datetime | None = None
    ) -> bool:
        """Return whether nothing used the sandbox for `idle` (see `idle_since`)."""
        return now - self.idle_since(session_activity) >= idle


class ReaperAction(models.Model):
    """Something Craft did on its own to a sandbox or its agents, and why (for the inventory).

    The reaper writes one for each agent it stops, sandbox it terminates or re-claims, orphan
    it removes and sandbox it finds gone; a failed exec or health check that shows a sandbox
    gone writes one too. `sandbox` is empty for orphans that have no row.
    """

    class Kind(models.TextChoices):
        STOPPED_IDLE_AGENT = "stopped_idle_agent", "stopped an idle agent"
        STOPPED_AGENT = "stopped_agent", "stopped the agent of a sandbox that is not running"
        SLEPT_IDLE = "slept_idle", "put an idle sandbox to sleep"
        TERMINATED_IDLE = "terminated_idle", "terminated an idle sandbox"
        RECLAIMED_PROVISIONING = "reclaimed_provisioning", "re-claimed a stuck provisioning"
        RETRIED_TERMINATING = "retried_terminating", "retried a stuck termination"
        REMOVED_ORPHAN = "removed_orphan", "removed an orphan"
        MARKED_GONE = "marked_gone", "marked a vanished sandbox failed"

    sandbox = models.ForeignKey(
        Sandbox,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="reaper_actions",
    )
    kind = models.CharField(max_length=32, choices=Kind.choices)
    # What was acted on: a session id (agents), a folder or a pod or service name (orphans).
    target = models.CharField(max_length=255, blank=True)
    reason = models.TextField()
    at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.get_kind_display()} {self.target}".strip()


class WarmSandbox(models.Model):
    """A sandbox's resources made before anyone owns them: a warm pod, kept ready for a new
    user (CRAFT_K8S_WARM_SANDBOXES).

    Its `id` is the id of the sandbox that claims it (the pod, its Service and its Secret are
    named for it, as for any sandbox). A claim deletes the row and creates the sandbox's row
    with that id in one transaction, so at any moment exactly one of the two rows owns the
    resources, and the reaper never takes them for orphans. `slot` numbers the pool (one row
    per slot per backend, so workers that replenish at once never overfill it); a row in a
    slot at or past the setting is surplus. Only `ready` rows are claimed.
    """

    class Status(models.TextChoices):
        WARMING = "warming"  # its pod is created, not Ready yet
        READY = "ready"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    backend = models.CharField(max_length=32)
    slot = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.WARMING)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["backend", "slot"]
        constraints = [
            models.UniqueConstraint(fields=["backend", "slot"], name="one_warm_sandbox_per_slot")
        ]

    def __str__(self) -> str:
        return f"warm {self.backend} sandbox {self.slot} ({self.status})"
