"""The sandbox inventory for staff: who has what, in which state, idle how long, and what the
reaper did. The `craft` app extends it with the sandboxes' sessions and running turns."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from uuid import UUID

from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.timesince import timesince

from . import services
from .backends import get_backend
from .backends.budget import format_size
from .models import ReaperAction, Sandbox, WarmSandbox

REAPER_LOG_LENGTH = 20


@admin.register(Sandbox)
class SandboxAdmin(admin.ModelAdmin):
    """Deleting a sandbox terminates it first (see `services.terminate_before_delete`)."""

    list_display = [
        "id",
        "owner",
        "status",
        "backend",
        "reference",
        "live_connections",
        "idle",
        "disk",
        "latest_reaper_action",
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
        "status_changed_at",
        "last_activity_at",
        "idle",
        "terminated_at",
        "disk",
        "disk_measured_at",
        "live_connections",
        "health",
        "reaper_log",
    ]
    actions = ["sleep", "wake", "terminate", "stop_idle_connections"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Sandbox]:
        latest = ReaperAction.objects.filter(sandbox=OuterRef("pk")).order_by("-at", "-id")
        return (
            super()
            .get_queryset(request)
            .select_related("owner")
            .annotate(
                _latest_action_kind=Subquery(latest.values("kind")[:1]),
                _latest_action_at=Subquery(latest.values("at")[:1]),
            )
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Sandboxes are created by provisioning, never by hand.
        return False

    def session_activity(self, sandbox: Sandbox) -> datetime | None:
        """Return when the sandbox's sessions were last active (the craft app knows)."""
        return None

    @admin.display(description="live agents")
    def live_connections(self, sandbox: Sandbox) -> int:
        # Connections live in server processes; this counts the ones of this process.
        return services.live_connection_count(sandbox.pk)

    @admin.display(description="idle for")
    def idle(self, sandbox: Sandbox) -> str:
        """Time since the last use: sessions, agents, the sandbox's own activity."""
        if sandbox.status == Sandbox.Status.TERMINATED:
            return "-"
        return timesince(sandbox.idle_since(self.session_activity(sandbox)), timezone.now())

    @admin.display(description="disk", ordering="disk_bytes")
    def disk(self, sandbox: Sandbox) -> str:
        """What its files take on disk as last measured, and whether that is over the limit."""
        if sandbox.disk_bytes is None:
            return "-"
        used = format_size(sandbox.disk_bytes)
        limit = settings.CRAFT_SANDBOX_DISK
        if limit and sandbox.disk_bytes > limit:
            return f"{used} (over the limit of {format_size(limit)}: takes no new prompt)"
        return used

    @admin.display(description="latest reaper action", ordering="_latest_action_at")
    def latest_reaper_action(self, sandbox: Sandbox) -> str:
        kind = getattr(sandbox, "_latest_action_kind", None)
        at = getattr(sandbox, "_latest_action_at", None)
        if kind is None or at is None:
            return "-"
        return f"{ReaperAction.Kind(kind).label}, {timesince(at, timezone.now())} ago"

    @admin.display(description="reaper actions (latest first)")
    def reaper_log(self, sandbox: Sandbox) -> SafeString | str:
        actions = sandbox.reaper_actions.all()[:REAPER_LOG_LENGTH]
        if not actions:
            return "none"
        rows = format_html_join(
            "",
            "<li>{} — {}{}: {}</li>",
            (
                (
                    timezone.localtime(a.at).strftime("%Y-%m-%d %H:%M:%S"),
                    a.get_kind_display(),
                    f" ({a.target})" if a.target else "",
                    a.reason,
                )
                for a in actions
            ),
        )
        return format_html("<ul>{}</ul>", rows)

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

    @admin.action(description="Put selected sandboxes to sleep", permissions=["change"])
    def sleep(self, request: HttpRequest, queryset: QuerySet[Sandbox]) -> None:
        """Put running sandboxes to sleep (their agents stopped, their pods deleted, their files
        kept); never one with a running turn or a queued prompt (`busy_sandboxes`)."""
        slept, busy = 0, []
        for sandbox in queryset.filter(status=Sandbox.Status.RUNNING):
            if services.sleep_sandbox(sandbox, self.busy_sandboxes, by_staff=True):
                slept += 1
            else:
                busy.append(str(sandbox.owner))
        if busy:
            self.message_user(
                request,
                f"Not put to sleep, because an agent is working in it: {', '.join(busy)}.",
                messages.WARNING,
            )
        plural = "sandbox" if slept == 1 else "sandboxes"
        self.message_user(request, f"Put {slept} {plural} to sleep.", messages.SUCCESS)

    @admin.action(description="Wake selected sandboxes", permissions=["change"])
    def wake(self, request: HttpRequest, queryset: QuerySet[Sandbox]) -> None:
        """Wake sleeping sandboxes: provisioned again on their files, in the background."""
        woken = 0
        for sandbox in queryset.filter(status=Sandbox.Status.SLEEPING).select_related("owner"):
            woken += services.request_sandbox(sandbox.owner).status == Sandbox.Status.PROVISIONING
        plural = "sandbox" if woken == 1 else "sandboxes"
        self.message_user(request, f"Waking {woken} {plural}.", messages.SUCCESS)

    def busy_sandboxes(self) -> Collection[UUID]:
        """Return the sandboxes with work that must not be put to sleep (none known here: the
        app that owns sessions says which have a running turn or a queued prompt)."""
        return frozenset()

    @admin.action(description="Delete selected sandboxes and their files…", permissions=["change"])
    def terminate(
        self, request: HttpRequest, queryset: QuerySet[Sandbox]
    ) -> TemplateResponse | None:
        """Ask first (a page listing them, as Django's delete action does), then terminate.

        Their users are told that an administrator stopped the sandbox (`by_staff`), and
        their sessions go on in a new sandbox at their next message.
        """
        live = queryset.exclude(status=Sandbox.Status.TERMINATED)
        if request.POST.get("post") != "yes":
            context = {
                **self.admin_site.each_context(request),
                "title": "Delete sandboxes?",
                "opts": self.model._meta,
                "rows": [(sandbox, self.describe(sandbox)) for sandbox in live],
                "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            }
            return TemplateResponse(
                request, "admin/sandboxes/sandbox/terminate_confirmation.html", context
            )
        done = 0
        for sandbox in live:
            sandbox = services.terminate_sandbox(sandbox, by_staff=True)
            if sandbox.status == Sandbox.Status.TERMINATED:
                done += 1
            else:
                self.message_user(
                    request, f"{sandbox.pk}: {sandbox.error or sandbox.status}", messages.ERROR
                )
        plural = "sandbox" if done == 1 else "sandboxes"
        self.message_user(request, f"Deleted {done} {plural}.", messages.SUCCESS)
        return None

    def describe(self, sandbox: Sandbox) -> str:
        """Return what the terminate confirmation says of a sandbox."""
        agents = services.live_connection_count(sandbox.pk)
        plural = "" if agents == 1 else "s"
        return f"{sandbox.status}, {agents} live agent{plural} in this server process"

    @admin.action(description="Stop idle agent connections", permissions=["change"])
    def stop_idle_connections(self, request: HttpRequest, queryset: QuerySet[Sandbox]) -> None:
        stopped = sum(
            services.stop_idle_connections(sandbox, idle_seconds=0) for sandbox in queryset
        )
        plural = "connection" if stopped == 1 else "connections"
        self.message_user(request, f"Stopped {stopped} idle agent {plural}.", messages.SUCCESS)

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return bool(request.user.is_staff and request.user.has_perm("sandboxes.change_sandbox"))


@admin.register(ReaperAction)
class ReaperActionAdmin(admin.ModelAdmin):
    """Everything the reaper did, orphans without a sandbox included; read-only."""

    list_display = ["at", "kind", "sandbox", "target", "reason"]
    list_filter = ["kind"]
    search_fields = ["target", "reason", "sandbox__id", "sandbox__owner__username"]
    list_select_related = ["sandbox__owner"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(WarmSandbox)
class WarmSandboxAdmin(admin.ModelAdmin):
    """The pool of warm sandboxes (CRAFT_K8S_WARM_SANDBOXES); read-only: the reaper thread of
    every server keeps it, and lowering the setting empties it."""

    list_display = ["slot", "backend", "status", "id", "created_at"]
    list_filter = ["status", "backend"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
