"""Search: a person's sessions by title and text, and the messages of one session.

What is searched is indexed per turn, as `SearchEntry` rows: the prompt, the agent's reply
with its chunks joined (a word split between two chunks is found), and each tool card (its
title, command and text output), each at most MAX_ENTRY_CHARS. Nothing is indexed on a
turn's way: a search first indexes the person's turns that ended since their sessions were
last indexed (`catch_up`: each session remembers how far it is, `Session.search_indexed_seq`;
a session whose `last_seq` is past it has something new), so a turn is found once it has
ended, a fork's copied turns too. `manage.py index_search` indexes every session again
(what is there is kept).

A query is cut into words (letters and digits); an entry matches when it has every word, each
as the start of one of its words ("refac" finds "refactored"), case and accents as the
database folds them: PostgreSQL through a GIN index of the text's `simple` tsvector, SQLite
through an FTS5 table (migration 0013). Titles match the same way, by substring. Only the
person's own sessions are ever looked at.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django.db import connection
from django.db.models import F

from craft.models import Event, SearchEntry, Session

logger = logging.getLogger(__name__)

MAX_ENTRY_CHARS = 20_000
MAX_QUERY_WORDS = 8
MAX_QUERY_CHARS = 200
# Entries read per query before they are grouped by session.
MAX_ENTRIES_READ = 400
MATCHES_PER_SESSION = 3
SNIPPET_CHARS = 160
# What a word of a query is: letters and digits (what both databases' tokenizers keep).
_WORD = re.compile(r"[^\W_]+")


@dataclass(frozen=True)
class Match:
    seq: int
    kind: str
    snippet: str


# --- indexing ----------------------------------------------------------------------------


def entries_of(events: Iterable[tuple[int, str, Any]]) -> list[tuple[int, str, str]]:
    """Return the (seq, kind, text) entries of one turn's events (seq, kind, data), in order."""
    entries: dict[int, tuple[str, list[str]]] = {}
    tools: dict[str, int] = {}  # a tool card's id -> the seq of its first event
    reply: int | None = None
    for seq, kind, data in events:
        if not isinstance(data, dict):
            continue
        if kind == "user_message" and isinstance(data.get("text"), str):
            entries[seq] = (SearchEntry.Kind.PROMPT, [data["text"]])
        elif kind == "agent_message_chunk":
            text = _text_of(data.get("content"))
            if text:
                if reply is None:
                    reply = seq
                    entries[seq] = (SearchEntry.Kind.REPLY, [])
                entries[reply][1].append(text)
        elif kind in ("tool_call", "tool_call_update"):
            ident = str(data.get("toolCallId", ""))
            first = tools.setdefault(ident, seq)
            parts = entries.setdefault(first, (SearchEntry.Kind.TOOL, []))[1]
            for value in _tool_texts(data):
                parts.append(value)
            reply = None  # text after a tool card is a reply of its own
    found = []
    for seq, (kind, parts) in sorted(entries.items()):
        joiner = "" if kind == SearchEntry.Kind.REPLY else "\n"
        text = joiner.join(parts).strip()[:MAX_ENTRY_CHARS]
        if text:
            found.append((seq, str(kind), text))
    return found


def _text_of(content: Any) -> str:
    if isinstance(content, dict) and content.get("type") == "text":
        text = content.get("text")
        return text if isinstance(text, str) else ""
    return ""


def _tool_texts(data: dict[str, Any]) -> Iterator[str]:
    if isinstance(data.get("title"), str):
        yield data["title"]
    raw = data.get("rawInput")
    if isinstance(raw, dict) and isinstance(raw.get("command"), str):
        yield raw["command"]
    for item in data.get("content") or ():
        if isinstance(item, dict) and item.get("type") == "content":
            text = _text_of(item.get("content"))
            if text:
                yield text


def index_session(session_id: UUID, after: int | None = None) -> int:
    """Index the session's turns that ended after event `after` (default: as far as it is
    indexed, `Session.search_indexed_seq`) and move that mark past them; a turn still running
    waits for a later call. Entries there already are kept. Return how many were written."""
    if after is None:
        after = (
            Session.objects.filter(pk=session_id)
            .values_list("search_indexed_seq", flat=True)
            .first()
        )
        if after is None:
            return 0
    rows = (
        Event.objects.filter(session_id=session_id, seq__gt=after)
        .order_by("seq")
        .values_list("seq", "kind", "data")
        .iterator(chunk_size=2000)
    )
    written, done = 0, after
    turn: list[tuple[int, str, Any]] = []
    for seq, kind, data in rows:
        if kind == "user_message" and turn:  # a turn with no end: indexed as it is
            written += _write(session_id, turn)
            done, turn = seq - 1, []
        if kind == "user_message" or turn:
            turn.append((seq, kind, data))
        else:
            done = seq  # between turns: nothing to index
        if kind == "turn_end" and turn:
            written += _write(session_id, turn)
            done, turn = seq, []
    Session.objects.filter(pk=session_id, search_indexed_seq__lt=done).update(
        search_indexed_seq=done
    )
    return written


def _write(session_id: UUID, turn: list[tuple[int, str, Any]]) -> int:
    entries = entries_of(turn)
    SearchEntry.objects.bulk_create(
        [SearchEntry(session_id=session_id, seq=s, kind=k, text=t) for s, k, t in entries],
        ignore_conflicts=True,
    )
    return len(entries)


def catch_up(user: Any) -> int:
    """Index what ended in the user's sessions since they were last indexed (a search does
    this first: nothing is indexed on a turn's way)."""
    behind = Session.objects.owned_by(user).filter(last_seq__gt=F("search_indexed_seq"))
    return sum(
        index_session(pk, after) for pk, after in behind.values_list("pk", "search_indexed_seq")
    )


# --- searching ---------------------------------------------------------------------------


def words_of(query: str) -> list[str]:
    """Return the query's words, lowercased, at most MAX_QUERY_WORDS."""
    return [word.lower() for word in _WORD.findall(query[:MAX_QUERY_CHARS])][:MAX_QUERY_WORDS]


def _entries(user_id: int, words: list[str], session_id: UUID | None, limit: int) -> list[Any]:
    """Return (session id, seq, kind, text) of the user's entries that have every word, newest
    first."""
    only = "AND e.session_id = %s" if session_id is not None else ""
    if connection.vendor == "postgresql":
        # The matches first, through the GIN index (materialized: else the planner may walk
        # the newest rows and compute each one's tsvector to find the first few), then the
        # owner's, newest first.
        sql = (
            "WITH hits AS MATERIALIZED (SELECT id, session_id, seq, kind, text "
            "FROM craft_searchentry WHERE to_tsvector('simple', text) @@ to_tsquery('simple', %s)) "
            "SELECT e.session_id, e.seq, e.kind, e.text FROM hits e "
            "JOIN craft_session s ON s.id = e.session_id "
            f"WHERE s.owner_id = %s {only} ORDER BY e.id DESC LIMIT %s"
        )
        match = " & ".join(f"{word}:*" for word in words)
    else:
        sql = (
            "SELECT e.session_id, e.seq, e.kind, e.text FROM craft_searchentry_fts f "
            "JOIN craft_searchentry e ON e.id = f.rowid "
            "JOIN craft_session s ON s.id = e.session_id "
            f"WHERE s.owner_id = %s AND craft_searchentry_fts MATCH %s {only} "
            "ORDER BY e.id DESC LIMIT %s"
        )
        match = " ".join(f'"{word}"*' for word in words)
    params: list[Any] = [match, user_id] if connection.vendor == "postgresql" else [user_id, match]
    if session_id is not None:
        params.append(session_id.hex if connection.vendor == "sqlite" else session_id)
    params.append(limit)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall())


def snippet(text: str, words: list[str]) -> str:
    """Return about SNIPPET_CHARS of `text` around its first word that starts like one of
    `words`, on one line, with "…" where it was cut."""
    flat = " ".join(text.split())
    lowered = flat.lower()
    found = [m.start() for w in words if (m := re.search(rf"\b{re.escape(w)}", lowered))]
    at = min(found) if found else 0
    start = max(0, at - SNIPPET_CHARS // 3)
    end = min(len(flat), start + SNIPPET_CHARS)
    start = max(0, min(start, end - SNIPPET_CHARS))
    return ("…" if start else "") + flat[start:end] + ("…" if end < len(flat) else "")


def search_sessions(user: Any, query: str, limit: int = 20) -> list[dict[str, Any]]:
    """Return the user's sessions that match `query`, by title first, then by text, the one
    with the newest match first; each with its latest MATCHES_PER_SESSION matches to jump to,
    oldest first."""
    words = words_of(query)
    if not words:
        return []
    catch_up(user)
    titled = Session.objects.owned_by(user)
    for word in words:
        titled = titled.filter(title__icontains=word)
    found: dict[UUID, dict[str, Any]] = {}
    for session in titled.recent_first()[:limit]:
        found[session.pk] = _result(session)
    matches: dict[UUID, list[Match]] = {}
    for session_id, seq, kind, text in _entries(user.pk, words, None, MAX_ENTRIES_READ):
        session_id = UUID(str(session_id))
        listed = matches.setdefault(session_id, [])
        if len(listed) < MATCHES_PER_SESSION:
            listed.append(Match(seq, kind, snippet(text, words)))
    missing = [pk for pk in matches if pk not in found][: max(0, limit - len(found))]
    sessions = Session.objects.owned_by(user).in_bulk(missing)
    for pk in missing:  # in the order of their newest match
        if pk in sessions:
            found[pk] = _result(sessions[pk])
    for pk, result in found.items():  # a session's matches in its order: the first opens it
        result["matches"] = [m.__dict__ for m in sorted(matches.get(pk, []), key=lambda m: m.seq)]
    return list(found.values())


def _result(session: Session) -> dict[str, Any]:
    return {"session": str(session.pk), "title": session.title,
            "updated_at": session.updated_at.isoformat()}  # fmt: skip


def search_session(user: Any, session_id: UUID, query: str, limit: int = 50) -> list[Match]:
    """Return the matches of `query` in one of the user's sessions, oldest first."""
    words = words_of(query)
    if not words:
        return []
    index_session(session_id)
    rows = _entries(user.pk, words, session_id, limit)
    return sorted((Match(seq, kind, snippet(text, words)) for _, seq, kind, text in rows),
                  key=lambda m: m.seq)  # fmt: skip
