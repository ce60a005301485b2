"""SQLite's numbering statements for many sessions at once: the leases read, the prompts
looked up, the sessions numbered, the rows inserted and the prompts' turns started, each in
one statement per SQLITE_SESSIONS sessions."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from craft.models import Event, Lease, Session
from craft.storage.eventlog import turn_rows
from craft.storage.eventlog.inserts import _insert_rows
from craft.storage.eventlog.records import _db, _Run

# SQLite numbers at most this many sessions per statement (two variables each).
SQLITE_SESSIONS = 500


def _number_many(runs: list[_Run], created: Any, now: datetime) -> dict[Any, tuple[int, Any]]:
    """SQLite: the leases read, the prompts looked up, the sessions numbered, the rows
    inserted and the prompts' turns started, each in one statement per SQLITE_SESSIONS
    sessions (the transaction holds the write lock from its start, so nothing changes a lease
    between the read and the UPDATE). A prompt stored before is left out (`_send_events`
    then says so)."""
    db = _db()
    session, lease = Session._meta.db_table, Lease._meta.db_table
    numbered: dict[Any, tuple[int, Any]] = {}
    with db.cursor() as cursor:
        for start in range(0, len(runs), SQLITE_SESSIONS):
            part = runs[start : start + SQLITE_SESSIONS]
            fenced = [run.pk for run in part if run.fence is not None]
            leases: dict[Any, tuple[str, int]] = {}
            if fenced:
                cursor.execute(
                    f"SELECT session_id, owner, token FROM {lease} WHERE session_id IN "
                    f"({', '.join(['%s'] * len(fenced))})",
                    fenced,
                )
                leases = {pk: (owner, int(token)) for pk, owner, token in cursor.fetchall()}
            repeated = _prompts_stored(cursor, [run for run in part if run.client_id])
            kept = [run for run in part
                    if (run.fence is None or leases.get(run.pk) == tuple(run.fence))
                    and run.pk not in repeated]  # fmt: skip
            if not kept:
                continue
            cursor.execute(
                f"WITH input(id, count) AS (VALUES {', '.join(['(%s, %s)'] * len(kept))}) "
                f"UPDATE {session} SET last_seq = {session}.last_seq + input.count, "
                f"updated_at = %s FROM input WHERE {session}.id = input.id "
                f"RETURNING {session}.id, {session}.last_seq, {session}.owner_id",
                [v for run in kept for v in (run.pk, len(run.events))] + [created],
            )
            numbered.update((pk, (int(last), owner)) for pk, last, owner in cursor.fetchall())
            rows = []
            for run in kept:
                if run.pk not in numbered:
                    continue
                first = numbered[run.pk][0] - len(run.events) + 1
                rows += [(run.pk, first + n, kind, text, run.client_id if n == 0 else None,
                          created) for n, (kind, text) in enumerate(run.events)]  # fmt: skip
            _insert_rows(cursor, rows)
            prompts = [(run.pk, numbered[run.pk][0]) for run in kept
                       if run.client_id and run.pk in numbered]  # fmt: skip
            turn_rows.start_many(cursor, prompts, now)
    return numbered


def _prompts_stored(cursor: Any, prompts: list[_Run]) -> set[Any]:
    """The sessions of `prompts` that already have an event with the prompt's client id."""
    if not prompts:
        return set()
    values = ", ".join(["(%s, %s)"] * len(prompts))
    cursor.execute(
        f"WITH prompt(session_id, client_id) AS (VALUES {values}) "
        f"SELECT prompt.session_id FROM prompt JOIN {Event._meta.db_table} AS event "
        "ON event.session_id = prompt.session_id AND event.client_id = prompt.client_id",
        [v for run in prompts for v in (run.pk, run.client_id)],
    )
    return {pk for (pk,) in cursor.fetchall()}
