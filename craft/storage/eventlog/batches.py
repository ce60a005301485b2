"""A batch of the writer's jobs stored in the caller's transaction: many sessions' leading
events numbered together (`postgresql`, `sqlite`), the rest one job at a time, pipelined on
PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import groupby
from typing import Any
from uuid import UUID

from craft.models import Event, Session
from craft.storage.eventlog import turn_rows
from craft.storage.eventlog.appending import _send_events
from craft.storage.eventlog.postgresql import _at_once, _number_many_postgresql
from craft.storage.eventlog.records import (
    _TURN_KINDS,
    Fence,
    Stored,
    _changes_list,
    _db,
    _heard,
    _Run,
    _stored_at,
)
from craft.storage.eventlog.sqlite import _number_many

# A batch's streamed events of at least this many sessions are numbered together, in one
# statement for all of them. One statement per session made a batch of 400 streaming
# sessions take 200+ ms on PostgreSQL (each statement is a round trip, and a parse and plan
# on the server) and 30-40 ms of the GIL on SQLite, and every session's next chunks waited.
MANY_SESSIONS = 2


@dataclass(slots=True)
class _Job:
    session_id: UUID
    events: Sequence[tuple[str, dict[str, Any]]]
    client_id: str | None
    fence: Fence | None
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Stored | None]


_Encoded = tuple[_Job, list[tuple[str, str]]]


def _store_batch(encoded: list[_Encoded], now: datetime) -> list[tuple[_Job, Stored | None]]:
    """Store a batch's jobs (sorted by session) in the caller's transaction, each session's
    in order. The leading streamed events of every session (or its prompt) are numbered
    together first; whatever that did not store (a turn's change, a prompt behind other
    appends, a repeated prompt, a fenced or gone session) goes through `_send_events`, one job
    at a time, after them."""
    db = _db()
    stored: dict[int, Stored | None] = {}
    leading = _leading(encoded)
    if len(leading) >= MANY_SESSIONS:
        stored = _store_many(encoded, leading, now)
    rest = [i for i, (_, events) in enumerate(encoded) if i not in stored and events]
    stored.update((i, None) for i, (_, events) in enumerate(encoded) if not events)

    def send(i: int) -> Callable[[], Stored | None]:
        job, events = encoded[i]
        return _send_events(job.session_id, job.events, events, job.client_id, now, job.fence)

    if len(rest) > 1 and all(_pipelined(db, *encoded[i]) for i in rest):
        # One statement per job, all sent before any answer is awaited: a round trip for the
        # batch, not one per job (400 sessions' turn ends at once took 400 in a row).
        with db.connection.pipeline():
            sent = [(i, send(i)) for i in rest]
        for i, finish in sent:
            stored[i] = finish()
    else:
        for i in rest:
            stored[i] = send(i)()
    return [(job, stored[i]) for i, (job, _) in enumerate(encoded)]


def _pipelined(db: Any, job: _Job, encoded: list[tuple[str, str]]) -> bool:
    """Whether a job may go in a pipeline: it is one statement (PostgreSQL, a small batch)
    and reads nothing after it, so that sending the next job's statement first changes
    nothing. A prompt starts its turn and a turn's end ends it in that statement; a
    permission's request or answer updates the turn's row after it (`turn_rows.follow`)."""
    if not _at_once(db, encoded):
        return False
    kinds = {kind for kind, _ in job.events} & _TURN_KINDS
    return not kinds or turn_rows.change_of(job.events, job.client_id) is not None


def _leading(encoded: list[_Encoded]) -> list[list[int]]:
    """Per session, the indexes of its first jobs up to its first prompt or turn change
    (and all under the same fence), if they hold any event; a session whose first job is a
    prompt has that job alone."""
    leading = []
    for _, group in groupby(range(len(encoded)), key=lambda i: encoded[i][0].session_id):
        run: list[int] = []
        for i in group:
            job = encoded[i][0]
            if not run and _lone_prompt(job):
                run.append(i)
                break
            if not _plain(job) or (run and job.fence != encoded[run[0]][0].fence):
                break
            run.append(i)
        if any(encoded[i][1] for i in run):
            leading.append(run)
    return leading


def _lone_prompt(job: _Job) -> bool:
    """A prompt and nothing else: its `user_message` alone, with its client id."""
    return job.client_id is not None and [kind for kind, _ in job.events] == ["user_message"]


def _plain(job: _Job) -> bool:
    """What the agent streams: no prompt, nothing the session's `TurnRecord` row follows."""
    return job.client_id is None and not any(kind in _TURN_KINDS for kind, _ in job.events)


def _store_many(
    encoded: list[_Encoded], leading: list[list[int]], now: datetime
) -> dict[int, Stored | None]:
    """Check, number and insert the jobs `leading` names, of many sessions, together; return
    what each job stored, by index. A session that was not numbered (fenced, gone) is left
    out, for `_send_events` to say why."""
    db = _db()
    runs = []
    for indexes in leading:
        job = encoded[indexes[0]][0]
        pk = Session._meta.pk.get_db_prep_value(job.session_id, db)
        events = [event for i in indexes for event in encoded[i][1]]
        runs.append(_Run(pk, job.fence, events, indexes, job.client_id))
    created = Event._meta.get_field("created_at").get_db_prep_value(now, db)
    if db.vendor == "postgresql":
        numbered = _number_many_postgresql(runs, created, now)
    else:
        numbered = _number_many(runs, created, now)
    stored: dict[int, Stored | None] = {}
    for run in runs:
        if run.pk not in numbered:
            continue
        last, owner_id = numbered[run.pk]
        seq = last - len(run.events) + 1
        for i in run.indexes:
            job, events = encoded[i]
            if not events:
                stored[i] = None
                continue
            stored[i] = _stored_at(seq, events)
            seq += len(events)
            if _changes_list(events):
                _heard().sessions_changed(owner_id, job.session_id)  # after commit
    return stored
