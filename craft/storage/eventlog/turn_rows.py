"""A turn's durable state: the one module that writes a `TurnRecord` row (craft.models).

A row is a prompt and everything until its `turn_end`, and only ever moves forward:

* **started** (state `running`) by a prompt, a `user_message` with a client id, in the
  transaction that stores it, stamped with this worker (`craft.storage.workers`). A session
  has at most one running turn: a constraint refuses a second (IntegrityError).
* **pending** while it runs: a `permission_request` (or an `elicitation_request` not refused)
  opens an entry of `pending`, its `permission_answer` (`elicitation_answer`) closes it.
* **ended** (state `ended`) by its `turn_end`: its stop reason, its end time, nothing pending.

The event log writes these changes in the statements that store the events (on PostgreSQL a
small batch is one statement, a round trip), so each of its paths takes its piece from here:
`cte` and `params` for the one-statement path (PostgreSQL), `many_started_cte` and
`new_values` for the many-sessions statement (PostgreSQL), `start_many` for SQLite's
many-sessions path, and `follow` for the three-statement path and for what a statement does
not follow (requests and answers).

Nothing else changes a turn's row: recovery ends a turn whose worker is gone by storing the
events that say so (`craft.turns.recovery`, with the row held by `lock_running`),
checkpoints note the workspace's commits beside a turn (`note_checkpoints`), and a fork
copies turns, ended (`copy_ended`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any
from uuid import UUID

from craft.models import Session, TurnRecord
from craft.storage import workers
from craft.storage.eventlog.records import _TURN_KINDS, _db

# SQLite's turns inserted in one statement take at most this many variables.
SQLITE_VARIABLES = 999


@dataclass(frozen=True, slots=True)
class TurnChange:
    """What one statement does to the session's `TurnRecord` row besides storing the events."""

    starts: bool  # a prompt: insert the running turn (else: end it)
    stop_reason: str = ""


def change_of(
    events: Sequence[tuple[str, dict[str, Any]]], client_id: str | None
) -> TurnChange | None:
    """The turn's start (a prompt alone) or end (a turn_end, with what the agent said last in
    its batch): the batches a statement can follow. Others go through `follow`."""
    kinds = {kind for kind, _ in events} & _TURN_KINDS
    if kinds == {"turn_end"}:
        data = [data for kind, data in events if kind == "turn_end"][-1]
        return TurnChange(starts=False, stop_reason=str(data.get("stop_reason", ""))[:64])
    if client_id is not None and [kind for kind, _ in events] == ["user_message"]:
        return TurnChange(starts=True)
    return None


# --- in the statements that store events ---------------------------------------------------


def params(change: TurnChange, session_pk: Any, created: Any, db: Any) -> dict[str, Any]:
    """The named parameters `cte` of `change` takes, for the session `session_pk`, now
    (`created`, as the database takes it)."""
    if change.starts:
        row = TurnRecord(session_id=session_pk, prompt_seq=0, worker=workers.me().key,
                   started_at=created)  # fmt: skip
        return {
            f"turn_{field.column}": field.get_db_prep_save(field.pre_save(row, True), db)
            for field in _fields()
        }
    return dict(
        running=TurnRecord.State.RUNNING, ended=TurnRecord.State.ENDED,
        stop_reason=change.stop_reason,
        no_pending=TurnRecord._meta.get_field("pending").get_db_prep_save({}, db),
    )  # fmt: skip


def cte(step: str) -> str:
    """The CTE of the one-statement path (PostgreSQL) that starts ("start") or ends ("end")
    the session's turn once `bump` numbered its events; its parameters are `params`'."""
    turns = TurnRecord._meta.db_table
    if step == "start":
        fields = _fields()
        columns = ", ".join(field.column for field in fields)
        values = ", ".join(
            "bump.last_seq - %(count)s + 1" if field.column == "prompt_seq"
            else f"%(turn_{field.column})s"
            for field in fields
        )  # fmt: skip
        return f"started AS (INSERT INTO {turns} ({columns}) SELECT {values} FROM bump)"
    return (
        f"ended AS (UPDATE {turns} SET state = %(ended)s, stop_reason = %(stop_reason)s, "
        "ended_at = %(now)s, pending = %(no_pending)s "
        "WHERE session_id = %(session)s AND state = %(running)s "
        "AND EXISTS (SELECT 1 FROM bump))"
    )


# A new turn's own columns; `_rest` has the others, the same for every turn started now.
TURN_KEYS = ["session_id", "prompt_seq"]


def many_started_cte(db: Any) -> str:
    """The CTE of the many-sessions statement (PostgreSQL) that starts the turns of the
    sessions `bump` numbered a prompt of; its positional parameters, last, are `new_values`'."""
    columns = ", ".join([*TURN_KEYS, *(field.column for field in _rest())])
    # A NULL's type is not the column's in a SELECT: each value is cast to its column's.
    values = ", ".join(
        ["bump.id", "bump.last_seq - bump.count + 1",
         *(f"%s::{field.db_type(db)}" for field in _rest())]
    )  # fmt: skip
    return (
        f"started AS (INSERT INTO {TurnRecord._meta.db_table} ({columns}) "
        f"SELECT {values} FROM bump WHERE bump.client_id IS NOT NULL)"
    )


def new_values(now: datetime) -> list[Any]:
    """The values of the columns besides `TURN_KEYS` of a running `TurnRecord` of this worker
    started `now`."""
    db = _db()
    turn = TurnRecord(prompt_seq=0, worker=workers.me().key, started_at=now)
    return [field.get_db_prep_save(field.pre_save(turn, True), db) for field in _rest()]


def start_many(cursor: Any, prompts: list[tuple[Any, int]], now: datetime) -> None:
    """Insert the running `TurnRecord` of each (session, prompt's seq), this worker's, in a few
    statements; a session with a turn running refuses (IntegrityError), as `start`."""
    if not prompts:
        return
    workers.ensure_registered()  # a turn's worker must be known, or it looks gone
    columns = [*TURN_KEYS, *(field.column for field in _rest())]
    shared = new_values(now)
    rows = [[pk, seq, *shared] for pk, seq in prompts]
    per_statement = max(1, SQLITE_VARIABLES // len(columns))
    for start in range(0, len(rows), per_statement):
        chunk = rows[start : start + per_statement]
        values = ", ".join([f"({', '.join(['%s'] * len(columns))})"] * len(chunk))
        cursor.execute(
            f"INSERT INTO {TurnRecord._meta.db_table} ({', '.join(columns)}) VALUES {values}",
            [v for row in chunk for v in row],
        )


def follow(
    session_id: UUID,
    events: Sequence[tuple[str, dict[str, Any]]],
    first_seq: int,
    client_id: str | None,
    now: datetime,
    worker_known: bool = False,
) -> None:
    """Keep the session's running `TurnRecord` in step with the events stored in this transaction.

    A prompt (a `user_message` with a client id) starts a turn: the constraint of one running
    turn per session refuses a second (IntegrityError). Permission and elicitation requests and
    their answers open and close entries of `pending`; `turn_end` ends the turn.
    """
    kinds = {kind for kind, _ in events} & _TURN_KINDS
    if not kinds or (kinds == {"user_message"} and client_id is None):
        return  # most batches: what the agent says, which the turn's row does not follow
    if kinds == {"turn_end"}:  # the turn's last batch: one statement, no read
        (data,) = [data for kind, data in events if kind == "turn_end"][-1:]
        end(session_id, str(data.get("stop_reason", ""))[:64], now)
        return
    # A prompt's batch starts the turn (the loop creates it): there is none to read.
    starts = client_id is not None and "user_message" in kinds
    turn = None if starts else TurnRecord.objects.running().filter(session_id=session_id).first()
    changed = False
    for kind, data in events:
        if kind == "user_message" and client_id is not None:
            if not worker_known:
                workers.ensure_registered()  # a turn's worker must be known, or it looks gone
            turn = start(session_id, first_seq, now)
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
            turn.state = TurnRecord.State.ENDED
            turn.stop_reason = str(data.get("stop_reason", ""))[:64]
            turn.ended_at = now
            turn.pending = {}
    if turn is not None and changed:
        turn.save(update_fields=["state", "stop_reason", "ended_at", "pending"])


# The statements of every prompt and every turn's end, written out once rather than built by
# the ORM per call: building them cost more than running them (about 0.2 ms each on SQLite).


def start(session_id: UUID, first_seq: int, now: datetime) -> TurnRecord:
    """Insert the running `TurnRecord` of the prompt stored at `first_seq`; return it, saved."""
    db = _db()
    turn = TurnRecord(session_id=session_id, prompt_seq=first_seq, worker=workers.me().key,
                started_at=now)  # fmt: skip
    fields = _fields()
    values = [field.get_db_prep_save(field.pre_save(turn, True), db) for field in fields]
    with db.cursor() as cursor:
        cursor.execute(_insert_sql(), values)
        turn.pk = cursor.fetchone()[0]
    turn._state.adding, turn._state.db = False, db.alias
    return turn


def end(session_id: UUID, stop_reason: str, now: datetime) -> None:
    """End the session's running `TurnRecord`, if it has one, with `stop_reason`."""
    db = _db()
    ended = TurnRecord._meta.get_field("ended_at").get_db_prep_save(now, db)
    pending = TurnRecord._meta.get_field("pending").get_db_prep_save({}, db)
    pk = Session._meta.pk.get_db_prep_value(session_id, db)
    with db.cursor() as cursor:
        cursor.execute(
            f"UPDATE {TurnRecord._meta.db_table} SET state = %s, stop_reason = %s, ended_at = %s, "
            "pending = %s WHERE session_id = %s AND state = %s",
            [TurnRecord.State.ENDED, stop_reason, ended, pending, pk, TurnRecord.State.RUNNING],
        )


@lru_cache(maxsize=1)
def _fields() -> list[Any]:
    return [field for field in TurnRecord._meta.concrete_fields if not field.primary_key]


@lru_cache(maxsize=1)
def _rest() -> list[Any]:
    return [field for field in _fields() if field.column not in TURN_KEYS]


@lru_cache(maxsize=1)
def _insert_sql() -> str:
    fields = _fields()
    columns = ", ".join(field.column for field in fields)
    values = ", ".join(["%s"] * len(fields))
    return (
        f"INSERT INTO {TurnRecord._meta.db_table} ({columns}) VALUES ({values}) "
        f"RETURNING {TurnRecord._meta.pk.column}"
    )


# --- outside the event log's statements -------------------------------------------------------


def lock_running(turn_id: int, worker_id: str) -> TurnRecord | None:
    """Return the turn `turn_id` if it is running and `worker_id`'s, its row locked until the
    transaction ends (None if not): two workers that end it at once (recovery) end it once,
    the second seeing it ended."""
    return (
        TurnRecord.objects.select_for_update()
        .filter(pk=turn_id, state=TurnRecord.State.RUNNING, worker=worker_id)
        .first()
    )


def note_checkpoints(session_id: UUID, prompt_seq: int, **checkpoint: str) -> None:
    """Note the workspace's checkpoints (`checkpoint_before`, `checkpoint_after`) beside the
    session's turn of the prompt at `prompt_seq`."""
    TurnRecord.objects.filter(session_id=session_id, prompt_seq=prompt_seq).update(**checkpoint)


def copy_ended(source_id: UUID, session_id: UUID, copies: list[tuple[int, int, str, str]]) -> None:
    """Copy turns of session `source_id` to `session_id` (a fork), ended, each
    (its prompt's seq in the source, its prompt's seq in the copy, the checkpoints before
    and after it); a turn the source does not have is left out."""
    sources = TurnRecord.objects.filter(
        session_id=source_id, prompt_seq__in=[source_seq for source_seq, *_ in copies]
    ).only("prompt_seq", "worker", "stop_reason", "started_at", "ended_at")
    rows = {row.prompt_seq: row for row in sources}
    copied = []
    for source_seq, prompt_seq, before, after in copies:
        if (row := rows.get(source_seq)) is not None:
            ended = TurnRecord(
                session_id=session_id, prompt_seq=prompt_seq, worker=row.worker,
                state=TurnRecord.State.ENDED, stop_reason=row.stop_reason,
                started_at=row.started_at, ended_at=row.ended_at, checkpoint_before=before,
                checkpoint_after=after,
            )  # fmt: skip
            copied.append(ended)
    TurnRecord.objects.bulk_create(copied)
