"""Reading the log: stored events after a seq, as websocket frames or HTTP API JSON, built
from the stored JSON text without decoding it."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.db.models import Func, TextField
from django.db.models.functions import Cast

from craft.models import Event
from craft.storage.normalise import event_frame, event_json


def frames_after(session_id: UUID, seq: int, limit: int) -> list[tuple[int, str]]:
    """Return (seq, websocket frame) of stored events after `seq`, built from the stored JSON
    text without decoding it."""
    rows = (
        Event.objects.filter(session_id=session_id, seq__gt=seq)
        .order_by("seq")
        .values_list("seq", "kind", Cast("data", TextField()))[:limit]
    )
    return [(seq, event_frame(seq, kind, text)) for seq, kind, text in rows]


class _UtcText(Func):
    """A timestamp as the database's text of it in UTC, `YYYY-MM-DD HH:MM:SS[.ffffff]`: what
    `_iso_utc` turns into `datetime.isoformat()`'s text without building a datetime (Django's
    conversion of each row's timestamp cost more than the rest of a page of history)."""

    output_field = TextField()

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        # Django stores an aware datetime as str() of it in UTC: exactly this text.
        return self.as_sql(compiler, connection, template="CAST(%(expressions)s AS TEXT)")

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return self.as_sql(
            compiler,
            connection,
            template="""to_char(%(expressions)s AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US')""",
        )


def _iso_utc(text: str) -> str:
    """`datetime.isoformat()` of a UTC timestamp from `_UtcText`'s text (which has no fraction,
    or six digits of it; isoformat leaves out a fraction of zero)."""
    if text.endswith(".000000"):
        text = text[:-7]
    return f"{text[:10]}T{text[11:]}+00:00"


def events_json_after(session_id: UUID, seq: int, limit: int) -> list[str]:
    """Return stored events after `seq` as HTTP API JSON objects, from the stored JSON text."""
    rows = (
        Event.objects.filter(session_id=session_id, seq__gt=seq)
        .order_by("seq")
        .values_list("seq", "kind", Cast("data", TextField()), _UtcText("created_at"))[:limit]
    )
    return [event_json(seq, kind, text, _iso_utc(created)) for seq, kind, text, created in rows]
