"""Storing one session's events: numbered in the transaction that stores them, with the
turn's row kept in step (`turn_rows`). `append_events` stores in the caller's thread and
transaction; the writer's batches (`batches`) send each job through `_send_events`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from functools import lru_cache, partial
from typing import Any
from uuid import UUID

from django.db import transaction
from django.utils import timezone

from craft.models import Event, Lease, Session, Worker
from craft.storage import workers
from craft.storage.eventlog import turn_rows
from craft.storage.eventlog.inserts import _insert_rows
from craft.storage.eventlog.postgresql import _at_once, _number_and_insert_at_once
from craft.storage.eventlog.records import (
    _TURN_KINDS,
    Fence,
    Fenced,
    Numbered,
    Stored,
    _changes_list,
    _db,
    _encode,
    _heard,
    _stored_at,
)
from craft.storage.eventlog.turn_rows import TurnChange


def _send_events(
    session_id: UUID,
    events: Sequence[tuple[str, dict[str, Any]]],
    encoded: list[tuple[str, str]],
    client_id: str | None,
    now: datetime,
    fence: Fence | None = None,
) -> Callable[[], Stored | None]:
    """Send what numbers and inserts encoded events of one session, in the caller's
    transaction; return what reads the answer and finishes the job (call it for what was
    stored). On PostgreSQL a small batch is one statement whose answer is read only then, so
    that a pipeline can carry many sessions' statements at once.

    With `client_id` (a prompt), store nothing and finish with None if the session already
    has an event with that id. With `fence`, finishing raises Fenced if that lease has moved
    on.
    """
    db = _db()
    pk = Session._meta.pk.get_db_prep_value(session_id, db)
    created = Event._meta.get_field("created_at").get_db_prep_value(now, db)
    turn = None
    if _at_once(db, encoded):
        turn = turn_rows.change_of(events, client_id)
        numbered = _number_and_insert_at_once(pk, encoded, client_id, created, fence, turn)
    else:
        if client_id is not None and _prompt_stored(session_id, client_id):
            return lambda: None
        done = _number_and_insert(pk, encoded, client_id, created, fence)
        numbered = lambda: done  # noqa: E731
    return partial(_numbered, session_id, events, encoded, client_id, now, turn, numbered)


def _numbered(
    session_id: UUID,
    events: Sequence[tuple[str, dict[str, Any]]],
    encoded: list[tuple[str, str]],
    client_id: str | None,
    now: datetime,
    turn: TurnChange | None,
    numbered: Callable[[], Numbered],
) -> Stored | None:
    """The rest of `_send_events` once the events were sent: what the numbering said."""
    result = numbered()
    if result is None:
        if client_id is not None and _prompt_stored(session_id, client_id):
            return None
        if not Session.objects.filter(pk=session_id).exists():
            raise Session.DoesNotExist(f"session {session_id} does not exist")
        raise Fenced(f"the lease on session {session_id} was taken over")
    last, owner_id, worker_known = result
    first = last - len(encoded) + 1
    kinds = {kind for kind, _ in events}
    if turn is not None:  # the statement started or ended the turn's row
        if turn.starts and not worker_known:
            workers.ensure_registered()  # a turn's worker must be known, or it looks gone
    elif _TURN_KINDS & kinds:
        turn_rows.follow(session_id, events, first, client_id, now, worker_known)
    if _changes_list(encoded):
        _heard().sessions_changed(owner_id, session_id)  # after commit
    return _stored_at(first, encoded)


def _number_and_insert(
    pk: Any, encoded: list[tuple[str, str]], client_id: str | None, created: Any,
    fence: Fence | None,
) -> Numbered:  # fmt: skip
    """Check the fence, number and insert in three statements (any size, any database)."""
    db = _db()
    with db.cursor() as cursor:
        worker_known = False
        if fence is not None:
            # A locking read: it waits for a takeover in progress (which holds the lease row)
            # and then sees its result. (A check inside the UPDATE below would not: under
            # READ COMMITTED a subquery keeps the snapshot from before the wait.) It also says
            # whether the owner's worker row exists, which a prompt's turn needs.
            cursor.execute(_fence_sql(db.vendor), [pk])
            owner, token, worker = cursor.fetchone() or (None, None, None)
            if (owner, token) != tuple(fence):
                return None
            worker_known = worker is not None
        cursor.execute(
            f"UPDATE {Session._meta.db_table} SET last_seq = last_seq + %s, "
            "updated_at = %s WHERE id = %s RETURNING last_seq, owner_id",
            [len(encoded), created, pk],
        )
        row = cursor.fetchone()
        if row is None:
            return None
        last = int(row[0])
        first = last - len(encoded) + 1
        rows = [
            (pk, first + i, kind, text, client_id if i == 0 else None, created)
            for i, (kind, text) in enumerate(encoded)
        ]
        _insert_rows(cursor, rows)
    return last, row[1], worker_known


@lru_cache(maxsize=2)
def _fence_sql(vendor: str) -> str:
    lease, worker = Lease._meta.db_table, Worker._meta.db_table
    lock = f" FOR SHARE OF {lease}" if vendor == "postgresql" else ""
    return (
        f"SELECT {lease}.owner, {lease}.token, {worker}.id FROM {lease} "
        f"LEFT JOIN {worker} ON {worker}.id = {lease}.owner "
        f"WHERE {lease}.session_id = %s{lock}"
    )


def _prompt_stored(session_id: UUID, client_id: str) -> bool:
    db = _db()
    pk = Session._meta.pk.get_db_prep_value(session_id, db)
    with db.cursor() as cursor:
        cursor.execute(
            f"SELECT 1 FROM {Event._meta.db_table} WHERE session_id = %s AND client_id = %s "
            "LIMIT 1",
            [pk, client_id],
        )
        return cursor.fetchone() is not None


def append_events(
    session_id: UUID,
    events: Sequence[tuple[str, dict[str, Any]]],
    *,
    client_id: str | None = None,
    fence: Fence | None = None,
) -> Stored | None:
    """Store events for a session in order, with consecutive seqs, in the caller's thread
    and transaction (one of its own if it has none).

    With `client_id` (a prompt), return None and store nothing if the session already has an
    event with that id. With `fence`, raise Fenced if that lease has moved on. Listeners hear
    about the events after the transaction commits.
    """
    encoded = _encode(events)
    if not encoded:
        return None
    with transaction.atomic():
        stored = _send_events(session_id, events, encoded, client_id, timezone.now(), fence)()
        if stored is None:
            return None
        transaction.on_commit(
            lambda: _heard().publish(
                [(session_id, stored.first_seq, stored.last_seq, stored.frames)], None
            )
        )
    return stored
