"""Search: what a person waits for when they search 100,000 events of their sessions.

One user's 100 sessions hold 100,000 events in turns as agents write them (a prompt, a reply
in chunks, a tool card, the turn's end), indexed as a search indexes them; a
word of one session, a word of every session and a prefix are searched. Measured side by
side: `GET /api/search/` through daphne (what the page waits for) and the database's own
full-text query alone (the floor). On the site's database (SQLite by default;
`BENCH_DATABASE_URL` for PostgreSQL).

    .venv/bin/python -m bench.search [--events 100000] [--rounds 20]
"""

from __future__ import annotations

import asyncio
import random
import time
import urllib.request
from typing import Any
from urllib.parse import urlencode

from .harness import Figure, Site, median, run_alone

TARGET_MS = 100.0
SESSIONS = 100
CHUNKS = 8  # a reply's chunks per turn
EVENTS_PER_TURN = 3 + CHUNKS  # prompt, chunks, tool card, turn end
QUERIES = {"one session's word": "zanzibar", "every session's word": "parser",
           "a prefix": "refac"}  # fmt: skip


def _fill(site: Site, events: int) -> tuple[Any, str, float]:
    from craft.models import Event
    from craft.storage import search

    user, cookie = site.user("searcher")
    words = [f"w{n:04d}" for n in range(2000)] + ["parser", "refactoring", "module", "tests"]
    chance = random.Random(7)
    sessions = [site.session(user, f"bench {n}") for n in range(SESSIONS)]
    turns = events // EVENTS_PER_TURN
    rows = []
    for turn in range(turns):
        session = sessions[turn % SESSIONS]
        seq = (turn // SESSIONS) * EVENTS_PER_TURN

        def said(count: int) -> str:
            return " ".join(chance.choice(words) for _ in range(count))

        prompt = said(12) + (" zanzibar" if turn == turns // 2 else "")
        rows.append(Event(session_id=session, seq=seq + 1, kind="user_message",
                          data={"text": prompt}))  # fmt: skip
        for n in range(CHUNKS):
            chunk = {"content": {"type": "text", "text": said(6) + " "}}
            rows.append(Event(session_id=session, seq=seq + 2 + n, kind="agent_message_chunk",
                              data=chunk))  # fmt: skip
        tool = {"toolCallId": f"t{turn}", "title": "Run the tests",
                "rawInput": {"command": f"pytest -q {chance.choice(words)}"}}  # fmt: skip
        rows.append(Event(session_id=session, seq=seq + 2 + CHUNKS, kind="tool_call", data=tool))
        rows.append(Event(session_id=session, seq=seq + 3 + CHUNKS, kind="turn_end",
                          data={"stop_reason": "end_turn"}))  # fmt: skip
    Event.objects.bulk_create(rows, batch_size=2000)
    from django.db.models import Max

    from craft.models import Session

    for session, last in Event.objects.values_list("session_id").annotate(last=Max("seq")):
        Session.objects.filter(pk=session).update(last_seq=last)  # as the event log keeps it
    started = time.perf_counter()
    assert search.catch_up(user) > 0  # what the first search would do
    indexing = time.perf_counter() - started
    from django.db import connection

    if connection.vendor == "postgresql":  # as autovacuum would have by now
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE craft_searchentry")
            cursor.execute("ANALYZE craft_session")
    return user, cookie, indexing


def _floor(user: Any, word: str) -> float:
    """The database's own full-text query of the user's entries (what Craft's search runs
    first), in ms."""
    from craft.storage import search

    started = time.perf_counter()
    search._entries(user.pk, search.words_of(word), None, search.MAX_ENTRIES_READ)
    return (time.perf_counter() - started) * 1000


def _through_api(url: str, cookie: str, word: str) -> float:
    request = urllib.request.Request(f"{url}/api/search/?{urlencode({'q': word})}",
                                     headers={"Cookie": cookie})  # fmt: skip
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=30) as answer:
        answer.read()
    return (time.perf_counter() - started) * 1000


async def run(site: Site, events: int = 100_000, rounds: int = 20) -> list[Figure]:
    user, cookie, indexing = await asyncio.to_thread(_fill, site, events)
    figures = [
        Figure(f"search: indexing {events:,} events at once", indexing * 1000, "ms", "reported",
               None, "the first search after all of them ended (then only what is new)")
    ]  # fmt: skip
    with site.serve() as server:
        for label, word in QUERIES.items():
            _through_api(server.url, cookie, word)  # warm
            api, floor = [], []
            for _ in range(rounds):  # side by side, alternating
                api.append(await asyncio.to_thread(_through_api, server.url, cookie, word))
                floor.append(await asyncio.to_thread(_floor, user, word))
            took = median(api)
            figures.append(
                Figure(
                    f"search {events:,} events: {label}",
                    took,
                    "ms",
                    f"<= {TARGET_MS:g} ms",
                    took <= TARGET_MS,
                    f"median of {rounds}; the database's query alone {median(floor):.1f} ms",
                )
            )
    return figures


def main(argv: Any = None) -> None:
    run_alone(__doc__.splitlines()[0], run, argv, events=100_000, rounds=20)


if __name__ == "__main__":
    main()
