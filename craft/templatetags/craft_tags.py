"""Template filters of the chat pages: human words for states stored as identifiers."""

from __future__ import annotations

from django import template

register = template.Library()

SANDBOX_LABELS = {
    "provisioning": "Starting…",
    "running": "Ready",
    "terminating": "Stopping…",
    "terminated": "Stopped",
    "failed": "Could not start",
    "sleeping": "Asleep — wakes with your next message",
}


@register.filter
def sandbox_label(status: str | None) -> str:
    """Return what a person reads for a sandbox status (None: no sandbox yet)."""
    if not status:
        return "Not started yet"
    return SANDBOX_LABELS.get(status, "Unknown")
