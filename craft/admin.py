"""Sessions and their events in the admin; events are the record, so they are read-only."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from .models import Event, Session


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
    list_display = ["title", "owner", "sandbox", "last_seq", "updated_at"]
    search_fields = ["title", "owner__username", "id"]
    readonly_fields = ["id", "owner", "sandbox", "agent_session_id", "last_seq", "created_at"]
    inlines = [EventInline]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
