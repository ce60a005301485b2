"""Sessions in the admin, with a link to their events (the record: read-only, never edited).

The sandbox inventory (`sandboxes.admin`) is extended here with what only this app knows:
each sandbox's sessions, its running turns, and its sessions' last activity (for idle time).
"""

from __future__ import annotations

import json
from collections.abc import Collection
from datetime import datetime
from uuid import UUID

from django.contrib import admin
from django.db.models import Count, Max, Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from craft.api.sessions import MAX_EVENTS_PAGE
from craft.models import Session, SessionRepository, TurnRecord
from craft.session_activity import session_activity
from craft.storage.eventlog import events_json_after
from sandboxes.admin import SandboxAdmin
from sandboxes.models import Sandbox


@admin.register(Session)
class SessionAdmin(admin.ModelAdmin):
    """A session's record; its transcript is linked, not drawn inline (a long session has
    tens of thousands of events: megabytes of HTML and seconds to render)."""

    list_display = [
        "title", "owner", "agent", "on_repository", "sandbox", "last_seq", "updated_at",
        "worker",
    ]  # fmt: skip
    list_select_related = ["owner", "sandbox", "lease", "repository"]
    list_filter = ["agent"]
    search_fields = ["title", "owner__username", "id"]
    readonly_fields = [
        "id", "owner", "agent", "on_repository", "sandbox", "agent_session_id", "last_seq",
        "transcript", "created_at", "updated_at", "worker",
    ]  # fmt: skip

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view(self.transcript_view)
        name = f"{self.opts.app_label}_{self.opts.model_name}_transcript"
        return [path("<uuid:session_id>/transcript/", view, name=name), *super().get_urls()]

    def transcript_view(self, request: HttpRequest, session_id: UUID) -> HttpResponse:
        """Return the session's events as the HTTP API's events page does (`after`, `limit`),
        for staff, whoever owns the session."""
        session = self.get_object(request, str(session_id))
        if session is None or not self.has_view_permission(request, session):
            raise Http404("no such session")
        try:
            after = max(int(request.GET.get("after", "0")), 0)
            limit = min(max(int(request.GET.get("limit", MAX_EVENTS_PAGE)), 1), MAX_EVENTS_PAGE)
        except ValueError:
            after, limit = 0, MAX_EVENTS_PAGE
        events = events_json_after(session.pk, after, limit + 1)
        rest = json.dumps({"has_more": len(events) > limit, "last_seq": session.last_seq})
        body = '{"events":[' + ",".join(events[:limit]) + "]," + rest[1:]
        return HttpResponse(body, content_type="application/json")

    @admin.display(description="transcript")
    def transcript(self, session: Session) -> SafeString:
        url = reverse("admin:craft_session_transcript", args=[session.pk])
        count = f"{session.last_seq} event{'' if session.last_seq == 1 else 's'}"
        return format_html(
            '<a href="{}">{}, as JSON</a> (pages of {}: add <code>?after=N</code>)',
            url, count, MAX_EVENTS_PAGE,
        )  # fmt: skip

    @admin.display(description="repository")
    def on_repository(self, session: Session) -> str:
        """The repository it works on (docs/repositories.md): where, its branch, how far its
        clone got, its pull request."""
        try:
            row = session.repository
        except SessionRepository.DoesNotExist:
            return "-"
        said = f"{row.host}/{row.path} on {row.branch or '?'} ({row.status}"
        if row.status == SessionRepository.Status.FAILED:
            said += f": {row.failure}"
        if row.pull_request_number is not None:
            said += f"; pull request #{row.pull_request_number} {row.pull_request_state}"
        return said + ")"

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
    fields = ("title", "owner", "agent", "created_at", "updated_at", "last_seq")
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
        running = Q(sessions__turns__state=TurnRecord.State.RUNNING)
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

    def busy_sandboxes(self) -> Collection[UUID]:
        return session_activity.busy().sandboxes

    def describe(self, sandbox: Sandbox) -> str:
        sessions = sandbox.sessions.count()
        turns = TurnRecord.objects.running().filter(session__sandbox=sandbox).count()
        return (
            f"{super().describe(sandbox)}, {sessions} session{'' if sessions == 1 else 's'}, "
            f"{turns} running turn{'' if turns == 1 else 's'}"
        )

    @admin.display(description="sessions", ordering="_session_count")
    def session_count(self, sandbox: Sandbox) -> int:
        return sandbox._session_count  # type: ignore[attr-defined]

    @admin.display(description="running turns", ordering="_running_turns")
    def running_turns(self, sandbox: Sandbox) -> int:
        return sandbox._running_turns  # type: ignore[attr-defined]


admin.site.unregister(Sandbox)
admin.site.register(Sandbox, SandboxWithSessionsAdmin)
