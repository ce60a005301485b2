"""Chat sessions and their event log."""

import uuid

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.db import models
from django.db.models import Q
from django.utils import timezone

from sandboxes.models import Sandbox


class SessionQuerySet(models.QuerySet["Session"]):
    def owned_by(self, user: User | AnonymousUser) -> "SessionQuerySet":
        return self.filter(owner=user)

    def recent_first(self) -> "SessionQuerySet":
        return self.order_by("-updated_at")


class Session(models.Model):
    """A conversation with an agent, in its own workspace of its owner's sandbox."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="chat_sessions"
    )
    sandbox = models.ForeignKey(Sandbox, on_delete=models.CASCADE, related_name="sessions")
    title = models.CharField(max_length=200, default="New session")
    # The id the agent gave this session in `session/new` (one per agent process).
    agent_session_id = models.CharField(max_length=200, blank=True)
    # Highest `Event.seq` handed out; bumped in the transaction that stores events.
    last_seq = models.PositiveBigIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    objects = SessionQuerySet.as_manager()

    class Meta:
        ordering = ["-updated_at"]

    def __str__(self) -> str:
        return self.title


class EventQuerySet(models.QuerySet["Event"]):
    def after(self, seq: int) -> "EventQuerySet":
        return self.filter(seq__gt=seq).order_by("seq")


class Event(models.Model):
    """One thing that happened in a session, numbered in order (the session's record)."""

    # No index of its own: the unique (session, seq) index serves every lookup by session, and
    # one index less is less work for every stored token.
    session = models.ForeignKey(
        Session, on_delete=models.CASCADE, related_name="events", db_index=False
    )
    seq = models.PositiveBigIntegerField()
    kind = models.CharField(max_length=64)
    data = models.JSONField(default=dict)
    # The client's id of a prompt (`user_message` events only): a resent prompt is found by
    # this index, and the constraint refuses to store it twice.
    # NULL, not "": every other event has none, and NULLs stay out of the unique index.
    client_id = models.CharField(max_length=100, null=True, blank=True)  # noqa: DJ001
    created_at = models.DateTimeField(default=timezone.now)

    objects = EventQuerySet.as_manager()

    class Meta:
        ordering = ["session", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["session", "seq"], name="event_seq_unique_per_session"),
            models.UniqueConstraint(
                fields=["session", "client_id"],
                condition=Q(client_id__isnull=False),
                name="event_client_id_unique_per_session",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.session_id}#{self.seq} {self.kind}"
