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

The package's modules, each one job:

* `records`: what every path shares (`Stored`, `Fence`, `Fenced`, the `Listener`);
* `appending`: one session's events stored (`append_events`), in three statements on any
  database or, on PostgreSQL, one (`postgresql`);
* `batches` and `group_commit`: the writer (`EventWriter`, `writer`) and how it stores a
  batch, many sessions' leading events numbered together (`postgresql`, `sqlite`);
* `inserts`: the event rows' INSERTs (SQLite) and COPY (PostgreSQL);
* `turn_rows`: a turn's durable state, the one module that writes a turn's row, whose pieces
  every statement above that starts or ends a turn takes;
* `reading`: `frames_after`, `events_json_after`.

What the rest of Craft uses is imported from here (and the few private helpers tests check).
"""

from craft.storage.eventlog.appending import append_events
from craft.storage.eventlog.group_commit import EventWriter, writer
from craft.storage.eventlog.inserts import _copy_field
from craft.storage.eventlog.postgresql import ONE_STATEMENT_ROWS
from craft.storage.eventlog.reading import events_json_after, frames_after
from craft.storage.eventlog.records import (
    Fence,
    Fenced,
    Listener,
    Notice,
    Stored,
    _changes_list,
    _encode,
    listen,
)

__all__ = [
    "ONE_STATEMENT_ROWS",
    "EventWriter",
    "Fence",
    "Fenced",
    "Listener",
    "Notice",
    "Stored",
    "_changes_list",
    "_copy_field",
    "_encode",
    "append_events",
    "events_json_after",
    "frames_after",
    "listen",
    "writer",
]
