"""Search through a real daphne, on PostgreSQL and again on SQLite: turns the demo agent ran are
indexed once they end, and a person finds their sessions by a word of the title, of a prompt,
of the agent's reply (its chunks joined) and of a tool card, and the matches in one session;
another person's sessions are never found, nor searchable."""

from __future__ import annotations

import io
from typing import Any
from urllib.parse import urlencode

import pytest

from craft.models import Event, SearchEntry, Session
from craft.storage import search
from tests.ready import open_ready_session
from tests.server import Daphne, Socket, api
from tests.sqlite_rerun import run_again_on_sqlite, runs_the_module_on_sqlite

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def server(tmp_path):
    server = Daphne(tmp_path).start()
    yield server
    server.stop()


def run_turns(server: Daphne, user: Any, session: Session, *prompts: str) -> None:
    """Run each prompt to its end in the session (nothing is indexed yet: a search does it)."""
    socket = Socket(server, user, session.pk)
    socket.send({"type": "resume", "after": 0})
    for n, text in enumerate(prompts):
        socket.send({"type": "prompt", "id": f"s{n}", "text": text})
        socket.until_kind("turn_end")
    socket.close()
    assert not SearchEntry.objects.filter(session=session).exists()


def found(server: Daphne, user: Any, query: str) -> tuple[int, Any]:
    return api(server, user, "GET", f"/api/search/?{urlencode({'q': query})}")


def test_daphne_sessions_are_found_by_title_prompt_reply_and_tool_card_and_only_their_owner_s(
    server, owner, stranger
):
    parser = open_ready_session(owner, "Refactor the parser")
    chatter = open_ready_session(owner, "Chatter")
    theirs = open_ready_session(stranger, "Their parser")
    run_turns(server, owner, chatter, "hello unicorns", "terminal 2 0")
    run_turns(server, stranger, theirs, "hello unicorns")

    status, body = found(server, owner, "parser")
    assert status == 200
    assert [r["session"] for r in body["results"]] == [str(parser.pk)]  # a title; not theirs
    assert body["results"][0]["title"] == "Refactor the parser"

    results = found(server, owner, "UNICORN")[1]["results"]  # any case, a word's start
    assert [r["session"] for r in results] == [str(chatter.pk)]
    kinds = {m["kind"]: m for m in results[0]["matches"]}
    assert set(kinds) == {"prompt", "reply"}
    assert kinds["prompt"]["snippet"] == "hello unicorns"
    assert kinds["reply"]["snippet"] == "Echo: hello unicorns"  # its chunks, joined
    prompt_seq = kinds["prompt"]["seq"]
    assert chatter.events.get(seq=prompt_seq).kind == "user_message"

    # A tool card: its command (`demo-build --lines 2`) and its output.
    tool = found(server, owner, "demo build")[1]["results"][0]["matches"]
    assert [m["kind"] for m in tool] == ["tool"]
    assert chatter.events.get(seq=tool[0]["seq"]).kind == "tool_call"
    assert found(server, owner, "hello zebra")[1]["results"] == []  # every word must match

    # Within a session: its matches, oldest first; another person's is not found.
    status, body = api(server, owner, "GET", f"/api/sessions/{chatter.pk}/search/?q=unicorns")
    assert status == 200
    assert [m["kind"] for m in body["matches"]] == ["prompt", "reply"]
    assert api(server, owner, "GET", f"/api/sessions/{theirs.pk}/search/?q=unicorns")[0] == 404
    assert [r["session"] for r in found(server, stranger, "unicorns")[1]["results"]] == [
        str(theirs.pk)
    ]


def test_daphne_bad_queries_are_refused_and_signed_out_callers_too(server, owner):
    for query in ("", "   ", "!!!", "x" * (search.MAX_QUERY_CHARS + 1)):
        status, body = found(server, owner, query)
        assert status == 400, query
        assert body["error"]["code"] == "invalid"
    from tests.server import api_request

    assert api_request(server.url, "", "GET", "/api/search/?q=parser")[0] == 401


def test_the_index_command_indexes_what_was_missed_and_keeps_what_is_there(owner):
    session = open_ready_session(owner, "Before search")
    Event.objects.bulk_create([
        Event(session=session, seq=1, kind="user_message", data={"text": "hello narwhals"}),
        Event(session=session, seq=2, kind="turn_end", data={"stop_reason": "end_turn"}),
        Event(session=session, seq=3, kind="user_message", data={"text": "and walruses"}),
    ])  # fmt: skip
    search.index_session(session.pk)
    entries = list(SearchEntry.objects.filter(session=session).values_list("seq", "kind", "text"))
    SearchEntry.objects.filter(session=session).delete()  # as a session from before search
    from django.core.management import call_command

    call_command("index_search", stdout=io.StringIO())
    again = list(SearchEntry.objects.filter(session=session).values_list("seq", "kind", "text"))
    assert sorted(again) == sorted(entries)
    call_command("index_search", stdout=io.StringIO())
    assert SearchEntry.objects.filter(session=session).count() == len(entries)


def test_a_running_turn_is_found_once_it_has_ended(owner):
    session = open_ready_session(owner, "Running")
    Event.objects.bulk_create([
        Event(session=session, seq=1, kind="user_message", data={"text": "first ocelot"}),
        Event(session=session, seq=2, kind="turn_end", data={"stop_reason": "end_turn"}),
        Event(session=session, seq=3, kind="session_title", data={"title": "t"}),
        Event(session=session, seq=4, kind="user_message", data={"text": "second ocelot"}),
    ])  # fmt: skip
    Session.objects.filter(pk=session.pk).update(last_seq=4)
    assert [m.seq for m in search.search_session(owner, session.pk, "ocelot")] == [1]
    assert Session.objects.get(pk=session.pk).search_indexed_seq == 3  # up to the running one
    Event.objects.create(session=session, seq=5, kind="turn_end", data={"stop_reason": "end_turn"})
    Session.objects.filter(pk=session.pk).update(last_seq=5)
    hits = search.search_sessions(owner, "ocelot")  # catches up the user's sessions first
    assert [m["seq"] for m in hits[0]["matches"]] == [1, 4]


def test_entries_join_a_reply_s_chunks_and_keep_each_tool_card_whole():
    chunk = lambda text: {"content": {"type": "text", "text": text}}  # noqa: E731
    events = [
        (1, "user_message", {"text": "fix the bug"}),
        (2, "agent_message_chunk", chunk("Looking at the pars")),
        (3, "agent_message_chunk", chunk("er now.")),
        (4, "tool_call", {"toolCallId": "t", "title": "Run tests",
                          "rawInput": {"command": "pytest -q"}}),
        (5, "tool_call_update", {"toolCallId": "t", "content": [
            {"type": "content", "content": {"type": "text", "text": "3 passed"}}]}),
        (6, "agent_message_chunk", chunk("All green.")),
        (7, "turn_end", {"stop_reason": "end_turn"}),
    ]  # fmt: skip
    assert search.entries_of(events) == [
        (1, "prompt", "fix the bug"),
        (2, "reply", "Looking at the parser now."),
        (4, "tool", "Run tests\npytest -q\n3 passed"),
        (6, "reply", "All green."),
    ]


def test_the_database_finds_words_prefixes_and_accents_and_keeps_people_apart(owner, stranger):
    """The index itself, on this run's database (PostgreSQL, then SQLite)."""
    mine = open_ready_session(owner, "Café menu")
    theirs = open_ready_session(stranger, "Other")
    chunk = lambda text: {"content": {"type": "text", "text": text}}  # noqa: E731
    for session in (mine, theirs):
        said = [
            ("user_message", {"text": "Résumé the naïve refactoring"}),
            ("agent_message_chunk", chunk("Refactored 12 modu")),
            ("agent_message_chunk", chunk("les.")),
            ("turn_end", {"stop_reason": "end_turn"}),
        ]
        Event.objects.bulk_create(
            Event(session=session, seq=n, kind=kind, data=data)
            for n, (kind, data) in enumerate(said, 1)
        )
        assert search.index_session(session.pk) == 2
    assert search.index_session(mine.pk) == 0  # indexed as far as it goes
    search.index_session(mine.pk, after=0)  # again from the start: nothing doubled
    assert SearchEntry.objects.filter(session=mine).count() == 2
    hits = search.search_sessions(owner, "refac modules")
    assert [r["session"] for r in hits] == [str(mine.pk)]
    assert [(m["seq"], m["kind"]) for m in hits[0]["matches"]] == [(2, "reply")]
    assert search.search_sessions(owner, "résumé")[0]["matches"][0]["seq"] == 1
    assert [r["session"] for r in search.search_sessions(owner, "café")] == [str(mine.pk)]
    assert search.search_sessions(owner, "nothing here") == []
    assert [m.seq for m in search.search_session(owner, mine.pk, "refac")] == [1, 2]
    assert search.search_session(owner, theirs.pk, "refac") == []  # not theirs to search


@runs_the_module_on_sqlite
def test_search_works_the_same_on_sqlite(tmp_path):
    output = run_again_on_sqlite(__file__, tmp_path, deselect="on_sqlite or daphne_")
    assert "4 passed" in output, output[-2000:]
