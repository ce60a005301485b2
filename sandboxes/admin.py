"""The sandbox inventory for staff: who has what, in which state, with how many agents."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import Count, QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.timesince import timesince

from craft.models import Session

from . import services
from .backends import get_backend
from .models import Sandbox


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


@admin.register(Sandbox)
class SandboxAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "owner",
        "status",
        "backend",
        "reference",
        "session_count",
        "live_connections",
        "last_activity_at",
        "age",
    ]
    list_filter = ["status", "backend"]
    search_fields = ["owner__username", "owner__email", "reference"]
    readonly_fields = [
        "id",
        "owner",
        "backend",
        "status",
        "reference",
        "status_detail",
        "error",
        "created_at",
        "last_activity_at",
        "terminated_at",
        "live_connections",
        "health",
    ]
    inlines = [SessionInline]
    actions = ["terminate", "stop_idle_connections"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Sandbox]:
        return (
            super()
            .get_queryset(request)
            .select_related("owner")
            .annotate(_session_count=Count("sessions"))
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Sandboxes are created by provisioning, never by hand.
        return False

    @admin.display(description="sessions", ordering="_session_count")
    def session_count(self, sandbox: Sandbox) -> int:
        return sandbox._session_count  # type: ignore[attr-defined]

    @admin.display(description="live agents")
    def live_connections(self, sandbox: Sandbox) -> int:
        # Connections live in server processes; this counts the ones of this process.
        return services.live_connection_count(sandbox.pk)

    @admin.display(description="age", ordering="created_at")
    def age(self, sandbox: Sandbox) -> str:
        return timesince(timezone.now() - sandbox.age(), timezone.now())

    @admin.display(description="health")
    def health(self, sandbox: Sandbox) -> str:
        """Ask the backend now (the folder exists, the pod is ready); shown on the detail page."""
        if sandbox.status != Sandbox.Status.RUNNING:
            return f"not checked ({sandbox.status})"
        try:
            health = get_backend(sandbox.backend).health(sandbox)
        except Exception as exc:
            return f"check failed: {exc}"
        return f"{'ok' if health.ok else 'unhealthy'}: {health.detail}"

    @admin.action(description="Terminate selected sandboxes", permissions=["change"])
    def terminate(self, request: HttpRequest, queryset: QuerySet[Sandbox]) -> None:
        done = 0
        for sandbox in queryset.exclude(status=Sandbox.Status.TERMINATED):
            sandbox = services.terminate_sandbox(sandbox)
            if sandbox.status == Sandbox.Status.TERMINATED:
                done += 1
            else:
                self.message_user(
                    request, f"{sandbox.pk}: {sandbox.error or sandbox.status}", messages.ERROR
                )
        self.message_user(request, f"Terminated {done} sandbox(es).", messages.SUCCESS)

    @admin.action(description="Stop idle agent connections", permissions=["change"])
    def stop_idle_connections(self, request: HttpRequest, queryset: QuerySet[Sandbox]) -> None:
        stopped = sum(
            services.stop_idle_connections(sandbox, idle_seconds=0) for sandbox in queryset
        )
        self.message_user(request, f"Stopped {stopped} idle agent connection(s).", messages.SUCCESS)

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return bool(request.user.is_staff and request.user.has_perm("sandboxes.change_sandbox"))
