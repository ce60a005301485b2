"""Read a session's stored log in tests."""

from __future__ import annotations

from craft.models import Event
from craft.storage.db import db_sync_to_async


def log_of(session) -> list[tuple[int, str, dict]]:
    """Return the session's events as (seq, kind, data), in order."""
    return [(e.seq, e.kind, e.data) for e in Event.objects.filter(session=session).order_by("seq")]


stored_log = db_sync_to_async(log_of)
"""`log_of` for async tests (on the database threads)."""
