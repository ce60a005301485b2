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


class Sandbox(models.Model):
    """One user's isolated place to run agents: a folder (local) or a pod (kubernetes).

    Lifecycle: provisioning -> running -> terminating -> terminated, and failed from
    provisioning (a failed sandbox can be provisioned again). Each user has at most one sandbox
    that is not terminated; terminated ones stay as the inventory's history.
    """

    class Status(models.TextChoices):
        PROVISIONING = "provisioning"
        RUNNING = "running"
        TERMINATING = "terminating"
        TERMINATED = "terminated"
        FAILED = "failed"

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
    last_activity_at = models.DateTimeField(default=timezone.now)
    terminated_at = models.DateTimeField(null=True, blank=True)

    objects = SandboxQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
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
