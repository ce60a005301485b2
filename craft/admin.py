"""Sessions and their events in the admin; events are the record, so they are read-only.

The sandbox inventory (`sandboxes.admin`) is extended here with what only this app knows:
each sandbox's sessions, its running turns, and its sessions' last activity (for idle time).
"""

from __future__ import annotations

from datetime import datetime

from django.contrib import admin
from django.db.models import Count, Max, Q, QuerySet
from django.http import HttpRequest
from django.utils import timezone

from craft.models import Event, Session, Turn
from sandboxes.admin import SandboxAdmin
from sandboxes.models import Sandbox


class EventInline(admin.TabularInline):
    model = Event
    fields = ("seq", "kind", "data", "created_at")
    readonly_fields = fields
    extra = 0
    can_delete = False
    ordering = ["seq"]

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(Session)
class SessionAdmin(admin.ModelAdmin):
    list_display = ["title", "owner", "sandbox", "last_seq", "updated_at", "worker"]
    list_select_related = ["owner", "sandbox", "lease"]
    search_fields = ["title", "owner__username", "id"]
    readonly_fields = [
        "id", "owner", "sandbox", "agent_session_id", "last_seq", "created_at", "worker",
    ]  # fmt: skip
    inlines = [EventInline]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.display(description="worker (lease)")
    def worker(self, session: Session) -> str:
        """Which server process runs the session's agent (craft.cluster.leases), if any."""
        lease = getattr(session, "lease", None)
        if lease is None:
            return "-"
        state = "held" if lease.expires_at > timezone.now() else "expired"
        return f"{lease.owner} ({state}, token {lease.token})"


class SessionInline(admin.TabularInline):
    # The inventory shows a sandbox's sessions; editing them belongs to the session admin.
    model = Session
    fields = ("title", "owner", "created_at", "updated_at", "last_seq")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


class SandboxWithSessionsAdmin(SandboxAdmin):
    """The sandbox inventory, with sessions, running turns and session activity."""

    list_display = [
        *SandboxAdmin.list_display[:5],
        "session_count",
        "running_turns",
        *SandboxAdmin.list_display[5:],
    ]
    inlines = [*SandboxAdmin.inlines, SessionInline]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Sandbox]:
        running = Q(sessions__turns__state=Turn.State.RUNNING)
        return (
            super()
            .get_queryset(request)
            .annotate(
                _session_count=Count("sessions", distinct=True),
                _running_turns=Count("sessions__turns", filter=running, distinct=True),
                _session_activity=Max("sessions__updated_at"),
            )
        )

    def session_activity(self, sandbox: Sandbox) -> datetime | None:
        return getattr(sandbox, "_session_activity", None)

    @admin.display(description="sessions", ordering="_session_count")
    def session_count(self, sandbox: Sandbox) -> int:
        return sandbox._session_count  # type: ignore[attr-defined]

    @admin.display(description="running turns", ordering="_running_turns")
    def running_turns(self, sandbox: Sandbox) -> int:
        return sandbox._running_turns  # type: ignore[attr-defined]


admin.site.unregister(Sandbox)
admin.site.register(Sandbox, SandboxWithSessionsAdmin)
