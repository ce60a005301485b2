"""PostgreSQL's numbering statements: a small batch of one session checked, numbered and
inserted (and its turn started or ended) by one statement, and many sessions' leading events
by one statement for all of them. Each statement is a round trip."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from functools import lru_cache
from typing import Any

import psycopg

from craft.models import Event, Lease, Session, Worker
from craft.storage import workers
from craft.storage.eventlog import turn_rows
from craft.storage.eventlog.inserts import _COLUMNS
from craft.storage.eventlog.records import Fence, Numbered, _db, _Run
from craft.storage.eventlog.turn_rows import TurnChange

# Events up to which PostgreSQL stores a batch in one statement. Each statement is a round
# trip and about 0.4 ms through Django, and a streamed turn's batches are a few events each.
ONE_STATEMENT_ROWS = 32


def _at_once(db: Any, encoded: list[tuple[str, str]]) -> bool:
    """Whether the events are stored by one statement (`_number_and_insert_at_once`)."""
    return db.vendor == "postgresql" and len(encoded) <= ONE_STATEMENT_ROWS


def _number_and_insert_at_once(
    pk: Any, encoded: list[tuple[str, str]], client_id: str | None, created: Any,
    fence: Fence | None, turn: TurnChange | None,
) -> Callable[[], Numbered]:  # fmt: skip
    """Check, number and insert (and start or end the turn) in one statement (PostgreSQL);
    return what reads its answer (in a pipeline, it comes only once the pipeline is synced).

    The fence's locking read is a CTE of the same statement: it waits for a takeover in
    progress and then returns the lease row's newest version (a locking read follows the
    row's updates, unlike a plain subquery), so the UPDATE runs only if the lease is still
    this one. The rows are inserted, and the turn changed, only if the UPDATE numbered them.
    """
    db = _db()
    params: dict[str, Any] = {"session": pk, "count": len(encoded), "now": created}
    if fence is not None:
        params["owner"], params["token"] = fence
    params["client_id"] = client_id
    for i, (kind, text) in enumerate(encoded):
        params[f"kind{i}"], params[f"data{i}"] = kind, text
    if turn is not None:
        params.update(turn_rows.params(turn, pk, created, db))
    step = None if turn is None else "start" if turn.starts else "end"
    sql = _at_once_sql(len(encoded), fence is not None, client_id is not None, step)
    cursor = db.cursor()
    try:
        cursor.execute(sql, params)
    except BaseException:
        cursor.close()
        raise

    def answer() -> Numbered:
        with cursor:
            numbered = cursor.fetchone()
        if numbered is None:
            return None
        return int(numbered[0]), numbered[1], numbered[2] is not None

    return answer


@lru_cache(maxsize=256)
def _at_once_sql(rows: int, fenced: bool, prompt: bool, turn: str | None) -> str:
    """The statement for `rows` events; `turn` "start" or "end" adds the turn row's change
    (`turn_rows.cte`)."""
    session, event = Session._meta.db_table, Event._meta.db_table
    lease, worker = Lease._meta.db_table, Worker._meta.db_table
    ctes, checks = [], ""
    if fenced:
        ctes.append(
            f"fence AS (SELECT {lease}.owner, {lease}.token, {worker}.id AS worker "
            f"FROM {lease} LEFT JOIN {worker} ON {worker}.id = {lease}.owner "
            f"WHERE {lease}.session_id = %(session)s FOR SHARE OF {lease})"
        )
        checks += " AND EXISTS (SELECT 1 FROM fence WHERE owner = %(owner)s AND token = %(token)s)"
    if prompt:
        checks += (
            f" AND NOT EXISTS (SELECT 1 FROM {event} "
            "WHERE session_id = %(session)s AND client_id = %(client_id)s)"
        )
    ctes.append(
        f"bump AS (UPDATE {session} SET last_seq = last_seq + %(count)s, updated_at = %(now)s "
        f"WHERE id = %(session)s{checks} RETURNING last_seq, owner_id)"
    )
    values = ", ".join(f"({i}, %(kind{i})s, %(data{i})s)" for i in range(rows))
    ctes.append(
        f"added AS (INSERT INTO {event} {_COLUMNS} "
        "SELECT %(session)s, bump.last_seq - %(count)s + 1 + v.i, v.kind, v.data::jsonb, "
        "CASE WHEN v.i = 0 THEN %(client_id)s END, %(now)s "
        f"FROM bump, (VALUES {values}) AS v(i, kind, data))"
    )
    if turn is not None:
        ctes.append(turn_rows.cte(turn))
    worker_known = "(SELECT worker FROM fence)" if fenced else "NULL"
    return f"WITH {', '.join(ctes)} SELECT bump.last_seq, bump.owner_id, {worker_known} FROM bump"


def _number_many_postgresql(
    runs: list[_Run], created: Any, now: datetime
) -> dict[Any, tuple[int, Any]]:
    """One statement: check each run's fence (and a prompt's client id), number its events,
    insert them and start the prompts' turns; return the new last seq and the owner of each
    session numbered. A prompt stored before is left out (`_send_events` then says so)."""
    db = _db()
    owners = [run.fence[0] if run.fence else None for run in runs]
    tokens = [run.fence[1] if run.fence else None for run in runs]
    event_sessions, positions, kinds, texts = [], [], [], []
    for run in runs:
        for position, (kind, text) in enumerate(run.events):
            event_sessions.append(run.pk)
            positions.append(position)
            kinds.append(kind)
            texts.append(text)
    params = [
        [run.pk for run in runs], [len(run.events) for run in runs], owners, tokens,
        [run.client_id for run in runs], created, created, event_sessions, positions, kinds,
        texts, *turn_rows.new_values(now),
    ]  # fmt: skip
    # Bound on the server, not by Django's client-side cursor: the arrays travel as values,
    # and the statement, always the same text, is prepared once per connection.
    with db.cursor() as wrapper, psycopg.Cursor(wrapper.cursor.connection) as cursor:
        cursor.execute(_many_sql(), params, prepare=True)
        rows = cursor.fetchall()
    if any(prompted for *_, prompted in rows):
        workers.ensure_registered()  # a turn's worker must be known, or it looks gone
    return {row[0]: (int(row[1]), row[2]) for row in rows}


@lru_cache(maxsize=1)
def _many_sql() -> str:
    """Many sessions' events, numbered per session: the fence's locking reads of every lease
    first (in session order, as a takeover locks a lease before its session), then one UPDATE
    of the sessions whose lease is still theirs (or that carry no fence) and whose prompt, if
    they carry one, is not stored yet, then the rows and the prompts' turns
    (`turn_rows.many_started_cte`)."""
    session, event, lease = Session._meta.db_table, Event._meta.db_table, Lease._meta.db_table
    return (
        "WITH input AS (SELECT * FROM unnest(%s::uuid[], %s::int[], %s::text[], %s::bigint[], "
        "%s::text[]) AS i(session_id, count, owner, token, client_id)), "
        f"fence AS MATERIALIZED (SELECT {lease}.session_id, {lease}.owner, {lease}.token "
        f"FROM {lease} WHERE {lease}.session_id IN "
        "(SELECT session_id FROM input WHERE owner IS NOT NULL) "
        f"ORDER BY {lease}.session_id FOR SHARE OF {lease}), "
        f"bump AS (UPDATE {session} SET last_seq = {session}.last_seq + input.count, "
        f"updated_at = %s FROM input WHERE {session}.id = input.session_id AND "
        "(input.owner IS NULL OR EXISTS (SELECT 1 FROM fence WHERE fence.session_id = "
        "input.session_id AND fence.owner = input.owner AND fence.token = input.token)) AND "
        f"(input.client_id IS NULL OR NOT EXISTS (SELECT 1 FROM {event} WHERE "
        f"{event}.session_id = input.session_id AND {event}.client_id = input.client_id)) "
        f"RETURNING {session}.id, {session}.last_seq, {session}.owner_id, input.count, "
        "input.client_id), "
        f"added AS (INSERT INTO {event} {_COLUMNS} "
        "SELECT e.session_id, bump.last_seq - bump.count + 1 + e.position, e.kind, "
        "e.data::jsonb, CASE WHEN e.position = 0 THEN bump.client_id END, %s "
        "FROM unnest(%s::uuid[], %s::int[], %s::text[], %s::text[]) "
        "AS e(session_id, position, kind, data) JOIN bump ON bump.id = e.session_id), "
        f"{turn_rows.many_started_cte(_db())} "
        "SELECT id, last_seq, owner_id, client_id IS NOT NULL FROM bump"
    )
