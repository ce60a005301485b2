"""What every path of the event log shares: what an append stored, the fence it carries, who
hears of commits, and the kinds of events the log looks at."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django.db import DEFAULT_DB_ALIAS, connections

from craft.storage.normalise import encode_event, event_frame

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


def _stored_at(first: int, encoded: list[tuple[str, str]]) -> Stored:
    """What storing `encoded` from seq `first` on stored, with its frames."""
    frames = [event_frame(first + i, kind, text) for i, (kind, text) in enumerate(encoded)]
    return Stored(first, first + len(encoded) - 1, frames, sum(len(text) for _, text in encoded))


class Fenced(Exception):
    """The writer's lease on the session was taken over: it may store nothing more there."""


# (owner, token) of a lease: appends that carry one are refused once the lease has moved on.
Fence = tuple[str, int]

# (the session's new last seq, its owner's id, whether the lease owner's worker row exists),
# or None if nothing was stored: a prompt stored before, a lease taken over, no session.
Numbered = tuple[int, Any, bool] | None


@dataclass(slots=True)
class _Run:
    """One session's leading jobs in a batch, numbered together."""

    pk: Any  # the session's primary key, as the database takes it
    fence: Fence | None
    events: list[tuple[str, str]]
    indexes: list[int]
    client_id: str | None = None  # a prompt's (`_lone_prompt`): it starts the session's turn


# What the session's turn row follows (`turn_rows`).
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
