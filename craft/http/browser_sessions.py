"""Browser sessions: Django's database session store, read by one statement written out.

Every HTTP request reads its browser session, and every websocket reads it twice (at its
handshake, and again after joining its account's group: `craft.live.auth`). Django's store
reads it with `Session.objects.get(session_key=..., expire_date__gt=now)`, whose SQL Django
builds again at every call: about 0.4 ms of CPU, for a statement that takes a few hundredths
of that to run (docs/history/performance-diary.md, "What a session's opening costs").
Here the statement is written out, reads only the column `load` uses, and keeps Django's
meaning: a session that is missing or expired loads empty and forgets its key. Everything
else (saving, creating, flushing, the table, the cookie) is Django's own store:
sessions signed in before this engine are read the same way.
"""

from __future__ import annotations

from typing import Any, cast

from django.contrib.sessions.backends import db
from django.db import connections, router
from django.db.models import Field
from django.utils import timezone


class SessionStore(db.SessionStore):
    def _get_session_from_db(self) -> Any:
        key = self.session_key
        if key is None:
            return None
        model = self.model
        connection = connections[router.db_for_read(model)]
        quote = connection.ops.quote_name

        def column(name: str) -> str:
            return quote(cast(Field, model._meta.get_field(name)).column or name)

        sql = (
            f"SELECT {column('session_data')} FROM {quote(model._meta.db_table)}"
            f" WHERE {column('session_key')} = %s AND {column('expire_date')} > %s"
        )
        now = connection.ops.adapt_datetimefield_value(timezone.now())
        with connection.cursor() as cursor:
            cursor.execute(sql, [key, now])
            row = cursor.fetchone()
        if row is None:
            self._session_key = None
            return None
        return model(session_key=key, session_data=row[0])
