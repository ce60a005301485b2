"""The event log: every session's record, numbered in the transaction that stores it.

Seq numbers come from `Session.last_seq`, bumped with an UPDATE before the rows are inserted:
the UPDATE takes the row's write lock (PostgreSQL) or the database write lock (SQLite), so two
writers on one session are serialised and can never hand out the same number. Listeners hear
about events only after commit, and the database, not the channel layer, is the record.

Two ways in:

* `append_events` stores in the caller's thread and transaction (views, commands, tests).
* `writer.append` is how event-loop code stores: one thread per process commits whatever every
  session has queued, in one transaction per batch (a group commit). A session's events are
  queued in the order they happened, so seqs follow that order. After commit the writer hands
  each batch's frames, already encoded, to its `Listener` (the live layer, wired at start),
  which sends them to this process's sockets without reading them back.

Rows are written with one prepared INSERT per batch rather than through model instances: this
is the hot path of every streamed token. On PostgreSQL a small batch (a follow-up's are one or
two events) is checked, numbered and inserted, and its turn started or ended, by one
statement: each statement is a round trip, and many sessions' such statements in one batch
go in one pipeline. Many sessions' prompts of one batch are checked, numbered, inserted and
their turns started together, as their streamed events are. Values go through
`craft.storage.normalise` first, so every stored event can be replayed and rendered.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache, partial
from itertools import groupby
from typing import Any
from uuid import UUID

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.models import Func, TextField
from django.db.models.functions import Cast
from django.utils import timezone

from craft.models import Event, Lease, Session, Turn, Worker
from craft.storage import workers
from craft.storage.db import close_broken_connections
from craft.storage.normalise import encode_event, event_frame, event_json

logger = logging.getLogger(__name__)

# A batch stops growing at this many events, so one commit never holds everyone for long.
BATCH_EVENTS = 2_000

Notice = tuple[UUID, int, int, list[str] | None]  # session, first seq, last seq, frames
Settle = dict[asyncio.AbstractEventLoop, Callable[[], None]]


@dataclass(frozen=True, slots=True)
class Listener:
    """What hears of committed events: `craft.live`, above the log, wired in at start
    (`CraftConfig.ready` calls `listen`), so that the writer publishes and delivery listens.

    `publish(notices, settle)` hands committed batches to the sockets that follow their
    sessions (from any thread), then runs each loop's `settle` callback on that loop;
    `on_loop()` makes the running event loop hear of commits first-hand; `sessions_changed`
    (owner, session) tells an owner's pages, after commit, that their list of sessions changed.
    """

    publish: Callable[[list[Notice], Settle | None], None]
    on_loop: Callable[[], object]
    sessions_changed: Callable[[Any, Any], None]


_listener: Listener | None = None


def listen(listener: Listener) -> None:
    """Have `listener` hear of every commit of this process from now on."""
    global _listener
    _listener = listener


def _heard() -> Listener:
    assert _listener is not None, "craft.storage.eventlog.listen() was not called"
    return _listener


@dataclass(slots=True)
class Stored:
    """What one append stored: seqs `first_seq`..`last_seq` and their websocket frames."""

    first_seq: int
    last_seq: int
    frames: list[str]
    size: int = 0  # characters of stored JSON


def _encode(events: Sequence[tuple[str, dict[str, Any]]]) -> list[tuple[str, str]]:
    return [pair for kind, data in events for pair in encode_event(kind, data)]


def _db() -> Any:
    """This thread's database connection. `django.db.connection` is a proxy that looks the
    thread's connection up again at every attribute it is asked for, and the event log asks
    for several per statement: about a tenth of the writer's CPU on SQLite, a fifth on
    PostgreSQL (measured with the connection bound once, docs/history/performance-diary.md,
    "Lease renewal, prompts in one pipeline")."""
    return connections[DEFAULT_DB_ALIAS]


# Rows per INSERT statement on SQLite: one statement for many rows is about twice as fast as
# one per row (each row would also release and retake the GIL). PostgreSQL gets COPY instead:
# Django's client-side binding would re-parse a long multi-row statement on every call.
INSERT_ROWS = 100
_COLUMNS = "(session_id, seq, kind, data, client_id, created_at)"


@lru_cache(maxsize=128)
def _insert_sql(rows: int) -> str:
    values = ", ".join(["(%s, %s, %s, %s, %s, %s)"] * rows)
    return f"INSERT INTO {Event._meta.db_table} {_COLUMNS} VALUES {values}"


def _insert_rows(cursor: Any, rows: list[tuple[Any, ...]]) -> None:
    if cursor.db.vendor == "postgresql":
        with cursor.cursor.copy(f"COPY {Event._meta.db_table} {_COLUMNS} FROM STDIN") as copy:
            copy.write(_copy_text(rows))
        return
    for start in range(0, len(rows), INSERT_ROWS):
        chunk = rows[start : start + INSERT_ROWS]
        cursor.execute(_insert_sql(len(chunk)), [v for row in chunk for v in row])


def _copy_field(text: str) -> str:
    """`text` as a field of COPY's text format (a backslash starts an escape there)."""
    if "\\" in text:
        text = text.replace("\\", "\\\\")
    if "\t" in text or "\n" in text or "\r" in text:
        text = text.replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
    return text


def _copy_text(rows: list[tuple[Any, ...]]) -> str:
    """Event rows (`_COLUMNS`) as COPY's text format, written in one piece: psycopg's
    `write_row` adapts each value on its own (4.9 us of the writer's CPU a row; this 1.2 us).
    A batch's rows share their session and time, so each is spelled once."""
    lines = []
    spelled: dict[Any, str] = {}
    for session, seq, kind, data, client_id, created in rows:
        if session not in spelled:
            spelled[session] = str(session)
        if created not in spelled:
            spelled[created] = str(created)
        client = "\\N" if client_id is None else _copy_field(client_id)
        lines.append(
            f"{spelled[session]}\t{seq}\t{_copy_field(kind)}\t{_copy_field(data)}\t{client}\t"
            f"{spelled[created]}\n"
        )
    return "".join(lines)


class Fenced(Exception):
    """The writer's lease on the session was taken over: it may store nothing more there."""


# (owner, token) of a lease: appends that carry one are refused once the lease has moved on.
Fence = tuple[str, int]


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
        turn = _turn_change(events, client_id)
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
        _follow_turn(session_id, events, first, client_id, now, worker_known)
    if _changes_list(encoded):
        _heard().sessions_changed(owner_id, session_id)  # after commit
    return _stored_at(first, encoded)


def _at_once(db: Any, encoded: list[tuple[str, str]]) -> bool:
    """Whether the events are stored by one statement (`_number_and_insert_at_once`)."""
    return db.vendor == "postgresql" and len(encoded) <= ONE_STATEMENT_ROWS


def _stored_at(first: int, encoded: list[tuple[str, str]]) -> Stored:
    """What storing `encoded` from seq `first` on stored, with its frames."""
    frames = [event_frame(first + i, kind, text) for i, (kind, text) in enumerate(encoded)]
    return Stored(first, first + len(encoded) - 1, frames, sum(len(text) for _, text in encoded))


# (the session's new last seq, its owner's id, whether the lease owner's worker row exists),
# or None if nothing was stored: a prompt stored before, a lease taken over, no session.
Numbered = tuple[int, Any, bool] | None


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


# Events up to which PostgreSQL stores a batch in one statement. Each statement is a round
# trip and about 0.4 ms through Django, and a streamed turn's batches are a few events each.
ONE_STATEMENT_ROWS = 32


@dataclass(frozen=True, slots=True)
class TurnChange:
    """What one statement does to the session's `Turn` row besides storing the events."""

    starts: bool  # a prompt: insert the running turn (else: end it)
    stop_reason: str = ""


def _turn_change(
    events: Sequence[tuple[str, dict[str, Any]]], client_id: str | None
) -> TurnChange | None:
    """The turn's start (a prompt alone) or end (a turn_end, with what the agent said last in
    its batch): the batches a statement can follow. Others go through `_follow_turn`."""
    kinds = {kind for kind, _ in events} & _TURN_KINDS
    if kinds == {"turn_end"}:
        data = [data for kind, data in events if kind == "turn_end"][-1]
        return TurnChange(starts=False, stop_reason=str(data.get("stop_reason", ""))[:64])
    if client_id is not None and [kind for kind, _ in events] == ["user_message"]:
        return TurnChange(starts=True)
    return None


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
    if turn is not None and turn.starts:
        row = Turn(session_id=pk, prompt_seq=0, worker=workers.me().key, started_at=created)
        for field in _turn_fields():
            params[f"turn_{field.column}"] = field.get_db_prep_save(field.pre_save(row, True), db)
    elif turn is not None:
        params.update(
            running=Turn.State.RUNNING, ended=Turn.State.ENDED, stop_reason=turn.stop_reason,
            no_pending=Turn._meta.get_field("pending").get_db_prep_save({}, db),
        )  # fmt: skip
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
    """The statement for `rows` events; `turn` "start" or "end" adds the Turn row's change."""
    session, event, turns = Session._meta.db_table, Event._meta.db_table, Turn._meta.db_table
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
    if turn == "start":
        fields = _turn_fields()
        columns = ", ".join(field.column for field in fields)
        values = ", ".join(
            "bump.last_seq - %(count)s + 1" if field.column == "prompt_seq"
            else f"%(turn_{field.column})s"
            for field in fields
        )  # fmt: skip
        ctes.append(f"started AS (INSERT INTO {turns} ({columns}) SELECT {values} FROM bump)")
    elif turn == "end":
        ctes.append(
            f"ended AS (UPDATE {turns} SET state = %(ended)s, stop_reason = %(stop_reason)s, "
            "ended_at = %(now)s, pending = %(no_pending)s "
            "WHERE session_id = %(session)s AND state = %(running)s "
            "AND EXISTS (SELECT 1 FROM bump))"
        )
    worker_known = "(SELECT worker FROM fence)" if fenced else "NULL"
    return f"WITH {', '.join(ctes)} SELECT bump.last_seq, bump.owner_id, {worker_known} FROM bump"


_TURN_KINDS = {
    "user_message", "permission_request", "permission_answer", "elicitation_request",
    "elicitation_answer", "turn_end",
}  # fmt: skip
# What changes a session's line in its owner's list of sessions (craft.live.status).
_LISTED_KINDS = _TURN_KINDS | {
    "session_title", "repository_status", "pull_request_opened", "pull_request_updated",
}  # fmt: skip


def _changes_list(encoded: list[tuple[str, str]]) -> bool:
    """Say whether storing these events changes the session's line in a list of sessions:
    a repository's clone progress and set-up output (its `progress` and `output` keys,
    at most one a second) do not; its status does."""
    for kind, text in encoded:
        if kind not in _LISTED_KINDS:
            continue
        if kind != "repository_status" or ('"progress"' not in text and '"output"' not in text):
            return True
    return False


@lru_cache(maxsize=2)
def _fence_sql(vendor: str) -> str:
    lease, worker = Lease._meta.db_table, Worker._meta.db_table
    lock = f" FOR SHARE OF {lease}" if vendor == "postgresql" else ""
    return (
        f"SELECT {lease}.owner, {lease}.token, {worker}.id FROM {lease} "
        f"LEFT JOIN {worker} ON {worker}.id = {lease}.owner "
        f"WHERE {lease}.session_id = %s{lock}"
    )


def _follow_turn(
    session_id: UUID,
    events: Sequence[tuple[str, dict[str, Any]]],
    first_seq: int,
    client_id: str | None,
    now: datetime,
    worker_known: bool = False,
) -> None:
    """Keep the session's running `Turn` in step with the events stored in this transaction.

    A prompt (a `user_message` with a client id) starts a turn: the constraint of one running
    turn per session refuses a second (IntegrityError). Permission and elicitation requests and
    their answers open and close entries of `pending`; `turn_end` ends the turn.
    """
    kinds = {kind for kind, _ in events} & _TURN_KINDS
    if not kinds or (kinds == {"user_message"} and client_id is None):
        return  # most batches: what the agent says, which the turn's row does not follow
    if kinds == {"turn_end"}:  # the turn's last batch: one statement, no read
        (data,) = [data for kind, data in events if kind == "turn_end"][-1:]
        _end_turn(session_id, str(data.get("stop_reason", ""))[:64], now)
        return
    # A prompt's batch starts the turn (the loop creates it): there is none to read.
    starts = client_id is not None and "user_message" in kinds
    turn = None if starts else Turn.objects.running().filter(session_id=session_id).first()
    changed = False
    for kind, data in events:
        if kind == "user_message" and client_id is not None:
            if not worker_known:
                workers.ensure_registered()  # a turn's worker must be known, or it looks gone
            turn = _start_turn(session_id, first_seq, now)
            continue
        if turn is None or kind not in _TURN_KINDS:
            continue
        changed = True
        if kind == "permission_request":
            options = [str(o.get("optionId")) for o in data.get("options") or []
                       if isinstance(o, dict)]  # fmt: skip
            turn.pending[str(data.get("request"))] = options
        elif kind == "elicitation_request" and not data.get("refused"):
            turn.pending[str(data.get("request"))] = {"kind": "elicitation"}
        elif kind in ("permission_answer", "elicitation_answer"):
            turn.pending.pop(str(data.get("request")), None)
        elif kind == "turn_end":
            turn.state = Turn.State.ENDED
            turn.stop_reason = str(data.get("stop_reason", ""))[:64]
            turn.ended_at = now
            turn.pending = {}
    if turn is not None and changed:
        turn.save(update_fields=["state", "stop_reason", "ended_at", "pending"])


# The statements of every prompt and every turn's end, written out once rather than built by
# the ORM per call: building them cost more than running them (about 0.2 ms each on SQLite).


def _start_turn(session_id: UUID, first_seq: int, now: datetime) -> Turn:
    """Insert the running `Turn` of the prompt stored at `first_seq`; return it, saved."""
    db = _db()
    turn = Turn(session_id=session_id, prompt_seq=first_seq, worker=workers.me().key,
                started_at=now)  # fmt: skip
    fields = _turn_fields()
    values = [field.get_db_prep_save(field.pre_save(turn, True), db) for field in fields]
    with db.cursor() as cursor:
        cursor.execute(_turn_insert_sql(), values)
        turn.pk = cursor.fetchone()[0]
    turn._state.adding, turn._state.db = False, db.alias
    return turn


@lru_cache(maxsize=1)
def _turn_fields() -> list[Any]:
    return [field for field in Turn._meta.concrete_fields if not field.primary_key]


@lru_cache(maxsize=1)
def _turn_insert_sql() -> str:
    fields = _turn_fields()
    columns = ", ".join(field.column for field in fields)
    values = ", ".join(["%s"] * len(fields))
    return (
        f"INSERT INTO {Turn._meta.db_table} ({columns}) VALUES ({values}) "
        f"RETURNING {Turn._meta.pk.column}"
    )


def _end_turn(session_id: UUID, stop_reason: str, now: datetime) -> None:
    db = _db()
    ended = Turn._meta.get_field("ended_at").get_db_prep_save(now, db)
    pending = Turn._meta.get_field("pending").get_db_prep_save({}, db)
    pk = Session._meta.pk.get_db_prep_value(session_id, db)
    with db.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Turn._meta.db_table} SET state = %s, stop_reason = %s, ended_at = %s, "
            "pending = %s WHERE session_id = %s AND state = %s",
            [Turn.State.ENDED, stop_reason, ended, pending, pk, Turn.State.RUNNING],
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


# --- many sessions' streamed events at once -----------------------------------------------

# A batch's streamed events of at least this many sessions are numbered together, in one
# statement for all of them. One statement per session made a batch of 400 streaming
# sessions take 200+ ms on PostgreSQL (each statement is a round trip, and a parse and plan
# on the server) and 30-40 ms of the GIL on SQLite, and every session's next chunks waited.
MANY_SESSIONS = 2
# SQLite numbers at most this many sessions per statement (two variables each).
SQLITE_SESSIONS = 500
# SQLite's turns inserted in one statement take at most this many variables.
SQLITE_VARIABLES = 999

_Encoded = tuple["_Job", list[tuple[str, str]]]


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
    permission's request or answer updates the turn's row after it (`_follow_turn`)."""
    if not _at_once(db, encoded):
        return False
    kinds = {kind for kind, _ in job.events} & _TURN_KINDS
    return not kinds or _turn_change(job.events, job.client_id) is not None


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
    """What the agent streams: no prompt, nothing the session's `Turn` row follows."""
    return job.client_id is None and not any(kind in _TURN_KINDS for kind, _ in job.events)


@dataclass(slots=True)
class _Run:
    """One session's leading jobs in a batch, numbered together."""

    pk: Any  # the session's primary key, as the database takes it
    fence: Fence | None
    events: list[tuple[str, str]]
    indexes: list[int]
    client_id: str | None = None  # a prompt's (`_lone_prompt`): it starts the session's turn


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
        texts, *_turn_values(now),
    ]  # fmt: skip
    # Bound on the server, not by Django's client-side cursor: the arrays travel as values,
    # and the statement, always the same text, is prepared once per connection.
    with db.cursor() as wrapper, psycopg.Cursor(wrapper.cursor.connection) as cursor:
        cursor.execute(_many_sql(), params, prepare=True)
        rows = cursor.fetchall()
    if any(prompted for *_, prompted in rows):
        workers.ensure_registered()  # a turn's worker must be known, or it looks gone
    return {row[0]: (int(row[1]), row[2]) for row in rows}


# A new turn's own columns; `_turn_rest` has the others, the same for every turn started now.
TURN_KEYS = ["session_id", "prompt_seq"]


@lru_cache(maxsize=1)
def _turn_rest() -> list[Any]:
    return [field for field in _turn_fields() if field.column not in TURN_KEYS]


def _turn_values(now: datetime) -> list[Any]:
    """The values of `_turn_rest` for a running `Turn` of this worker started `now`."""
    db = _db()
    turn = Turn(prompt_seq=0, worker=workers.me().key, started_at=now)
    return [field.get_db_prep_save(field.pre_save(turn, True), db) for field in _turn_rest()]


@lru_cache(maxsize=1)
def _many_sql() -> str:
    """Many sessions' events, numbered per session: the fence's locking reads of every lease
    first (in session order, as a takeover locks a lease before its session), then one UPDATE
    of the sessions whose lease is still theirs (or that carry no fence) and whose prompt, if
    they carry one, is not stored yet, then the rows and the prompts' turns."""
    session, event, lease = Session._meta.db_table, Event._meta.db_table, Lease._meta.db_table
    db = _db()
    turn_columns = ", ".join([*TURN_KEYS, *(field.column for field in _turn_rest())])
    # A NULL's type is not the column's in a SELECT: each value is cast to its column's.
    turn_values = ", ".join(
        ["bump.id", "bump.last_seq - bump.count + 1",
         *(f"%s::{field.db_type(db)}" for field in _turn_rest())]
    )  # fmt: skip
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
        f"started AS (INSERT INTO {Turn._meta.db_table} ({turn_columns}) "
        f"SELECT {turn_values} FROM bump WHERE bump.client_id IS NOT NULL) "
        "SELECT id, last_seq, owner_id, client_id IS NOT NULL FROM bump"
    )


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
            _start_turns(cursor, [(run.pk, numbered[run.pk][0]) for run in kept
                                  if run.client_id and run.pk in numbered], now)  # fmt: skip
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


def _start_turns(cursor: Any, prompts: list[tuple[Any, int]], now: datetime) -> None:
    """Insert the running `Turn` of each (session, prompt's seq), this worker's, in a few
    statements; a session with a turn running refuses (IntegrityError), as `_start_turn`."""
    if not prompts:
        return
    workers.ensure_registered()  # a turn's worker must be known, or it looks gone
    columns = [*TURN_KEYS, *(field.column for field in _turn_rest())]
    shared = _turn_values(now)
    rows = [[pk, seq, *shared] for pk, seq in prompts]
    per_statement = max(1, SQLITE_VARIABLES // len(columns))
    for start in range(0, len(rows), per_statement):
        chunk = rows[start : start + per_statement]
        values = ", ".join([f"({', '.join(['%s'] * len(columns))})"] * len(chunk))
        cursor.execute(
            f"INSERT INTO {Turn._meta.db_table} ({', '.join(columns)}) VALUES {values}",
            [v for row in chunk for v in row],
        )


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


# --- the writer: group commits for event-loop code -----------------------------------------


@dataclass(slots=True)
class _Job:
    session_id: UUID
    events: Sequence[tuple[str, dict[str, Any]]]
    client_id: str | None
    fence: Fence | None
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Stored | None]


_STOP = object()


class EventWriter:
    """The process's event writer: one thread, one transaction per batch of queued appends."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    async def append(
        self,
        session_id: UUID,
        events: Sequence[tuple[str, dict[str, Any]]],
        *,
        client_id: str | None = None,
        fence: Fence | None = None,
    ) -> Stored | None:
        """Store events for a session and wait until they are committed; see append_events.

        With `fence`, raise `Fenced` (and store nothing) if that lease was taken over.
        """
        return await self.submit(session_id, events, client_id=client_id, fence=fence)

    def submit(
        self,
        session_id: UUID,
        events: Sequence[tuple[str, dict[str, Any]]],
        *,
        client_id: str | None = None,
        fence: Fence | None = None,
    ) -> asyncio.Future[Stored | None]:
        """Queue events for a session; the future resolves on this loop after commit.

        Appends of one session are committed in the order they were submitted, so a caller
        may submit the next batch before the previous one is committed.
        """
        loop = asyncio.get_running_loop()
        _heard().on_loop()  # this loop hears of the commit (and rings other processes) first-hand
        future: asyncio.Future[Stored | None] = loop.create_future()
        if self._thread is None:
            self._start()
        self._queue.put(_Job(session_id, events, client_id, fence, loop, future))
        return future

    def stop(self) -> None:
        """Commit what is queued, close the connection, end the thread."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(_STOP)
            thread.join(30)

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="craft-event-writer", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        from django.db import connections

        try:
            while True:
                job = self._queue.get()
                if job is _STOP:
                    return
                jobs, stop = [job], False
                size = len(job.events)
                while size < BATCH_EVENTS:
                    try:
                        job = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if job is _STOP:
                        stop = True
                        break
                    jobs.append(job)
                    size += len(job.events)
                self._commit(jobs)
                if stop:
                    return
        finally:
            connections.close_all()

    def _commit(self, jobs: list[_Job]) -> None:
        """Store a batch in one transaction; if it fails, store each job on its own."""
        outcomes: list[tuple[_Job, Stored | None, BaseException | None]]
        try:
            outcomes = [(job, stored, None) for job, stored in self._store(jobs)]
        except Exception:
            close_broken_connections()
            outcomes = []
            for job in jobs:
                try:
                    ((_, stored),) = self._store([job])
                except Exception as exc:
                    logger.warning("storing events of session %s failed: %s", job.session_id, exc)
                    close_broken_connections()
                    outcomes.append((job, None, exc))
                else:
                    outcomes.append((job, stored, None))
        self._finish(outcomes)

    def _store(self, jobs: list[_Job]) -> list[tuple[_Job, Stored | None]]:
        now = timezone.now()
        # Sessions in a fixed order (a stable sort keeps each session's own order), so that
        # two processes' writers always lock session rows in the same order.
        encoded = sorted(((job, _encode(job.events)) for job in jobs), key=_session_key)
        with transaction.atomic():
            return _store_batch(encoded, now)

    def _finish(self, outcomes: list[tuple[_Job, Stored | None, BaseException | None]]) -> None:
        """Deliver what was stored and resolve the callers' futures, one wake-up per loop."""
        notices: list[Notice] = [
            (job.session_id, stored.first_seq, stored.last_seq, stored.frames)
            for job, stored, _ in outcomes
            if stored is not None
        ]
        by_loop: dict[asyncio.AbstractEventLoop, list[Any]] = {}
        for outcome in outcomes:
            by_loop.setdefault(outcome[0].loop, []).append(outcome)
        _heard().publish(
            notices, {loop: partial(_settle, items) for loop, items in by_loop.items()}
        )


def _settle(outcomes: list[tuple[_Job, Stored | None, BaseException | None]]) -> None:
    for job, stored, exc in outcomes:
        if job.future.done():
            continue  # its caller gave up waiting (cancelled)
        if exc is not None:
            job.future.set_exception(exc)
        else:
            job.future.set_result(stored)


def _session_key(pair: tuple[_Job, Any]) -> str:
    return str(pair[0].session_id)


writer = EventWriter()


# --- reading ---------------------------------------------------------------------------------


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
