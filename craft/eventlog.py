"""The event log: every session's record, numbered in the transaction that stores it.

Seq numbers come from `Session.last_seq`, bumped with an UPDATE before the rows are inserted:
the UPDATE takes the row's write lock (PostgreSQL) or the database write lock (SQLite), so two
writers on one session are serialised and can never hand out the same number. Listeners are
told only after commit (`on_commit`), and the notice carries only the seq range: the database,
not the channel layer, is the record.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any
from uuid import UUID

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from .models import Event, Session

logger = logging.getLogger(__name__)

# Called after commit with (session id, last stored seq). Set by the live layer.
_listeners: list[Callable[[UUID, int], None]] = []


def add_listener(listener: Callable[[UUID, int], None]) -> None:
    if listener not in _listeners:
        _listeners.append(listener)


def append_events(session_id: UUID, events: Sequence[tuple[str, dict[str, Any]]]) -> list[Event]:
    """Store events for a session in order, with consecutive seq numbers, in one transaction.

    Returns the stored events. Listeners hear about them after the transaction commits.
    """
    if not events:
        return []
    now = timezone.now()
    with transaction.atomic():
        updated = Session.objects.filter(pk=session_id).update(
            last_seq=F("last_seq") + len(events), updated_at=now
        )
        if updated != 1:
            raise Session.DoesNotExist(f"session {session_id} does not exist")
        last = Session.objects.filter(pk=session_id).values_list("last_seq", flat=True).get()
        first = last - len(events) + 1
        rows = [
            Event(session_id=session_id, seq=first + i, kind=kind, data=data, created_at=now)
            for i, (kind, data) in enumerate(events)
        ]
        Event.objects.bulk_create(rows)
        transaction.on_commit(lambda: _notify(session_id, last))
    return rows


def append_event(session_id: UUID, kind: str, data: dict[str, Any]) -> Event:
    return append_events(session_id, [(kind, data)])[0]


def _notify(session_id: UUID, last_seq: int) -> None:
    for listener in _listeners:
        try:
            listener(session_id, last_seq)
        except Exception:
            logger.exception("event listener failed for session %s", session_id)


def events_after(session_id: UUID, seq: int, limit: int | None = None) -> list[Event]:
    queryset = Event.objects.filter(session_id=session_id).after(seq)
    if limit is not None:
        queryset = queryset[:limit]
    return list(queryset)
