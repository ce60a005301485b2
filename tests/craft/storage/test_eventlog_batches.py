"""One batch, many sessions: the writer numbers every session's streamed events together
(on SQLite, their prompts too).

On PostgreSQL each test holds the writer on an append whose session row another connection
has locked, so that what it submits meanwhile is committed as one batch; a lease row locked by
another connection then holds that batch's statement, which shows it is the one for many
sessions. On SQLite another connection holds the write lock while the appends are submitted;
`test_the_batches_hold_on_sqlite` runs this module again on SQLite.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest
from django.conf import settings
from django.db import IntegrityError
from django.db.models import F
from django.utils import timezone

from craft.models import Event, Lease, Session, TurnRecord
from craft.storage import workers
from craft.storage.db import db_sync_to_async
from craft.storage.eventlog import Fenced, writer
from tests.conftest import queries_in_every_thread
from tests.craft.cluster.test_fencing import other_connection, until, waiting_for_a_lock
from tests.ready import open_ready_session
from tests.sqlite_rerun import run_again_on_sqlite, runs_the_module_on_sqlite

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

SQLITE = settings.DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3"
postgresql_only = pytest.mark.skipif(SQLITE, reason="holds rows with PostgreSQL's locks")


def chunk(text: str) -> tuple[str, dict]:
    return ("agent_message_chunk", {"content": {"type": "text", "text": text}})


def waiting_statements(conn: psycopg.Connection) -> list[str]:
    """The statements of the backends waiting for a lock that `conn`'s transaction holds."""
    with psycopg.connect(conn.info.dsn, autocommit=True) as probe:
        rows = probe.execute(
            "SELECT query FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
            [conn.info.backend_pid],
        ).fetchall()
    return [row[0] for row in rows]


async def leased(owner, count: int) -> list[tuple[Session, tuple[str, int]]]:
    def make() -> list[tuple[Session, tuple[str, int]]]:
        made = []
        for i in range(count):
            session = open_ready_session(owner, f"s{i}")
            lease = Lease.objects.create(
                session_id=session.pk, owner=workers.me().key, expires_at=timezone.now()
            )
            made.append((session, (lease.owner, lease.token)))
        return made

    return await db_sync_to_async(make)()


@contextlib.asynccontextmanager
async def one_batch(held: tuple[Session, tuple[str, int]]) -> AsyncIterator[None]:
    """What is submitted inside is committed as one batch, after an append of `held`."""
    session, fence = held
    blocker = other_connection()
    try:
        blocker.execute("SELECT 1 FROM craft_session WHERE id = %s FOR UPDATE", [session.pk])
        first = asyncio.ensure_future(writer.append(session.pk, [chunk("held")], fence=fence))
        await until(lambda: waiting_for_a_lock(blocker), "the writer waits for the blocker")
        yield
        blocker.rollback()
        await first
    finally:
        blocker.close()


async def the_statement_for_many_sessions_waits_for(conn: psycopg.Connection) -> None:
    await until(lambda: waiting_for_a_lock(conn), "the batch waits for the lease")
    (statement,) = await asyncio.to_thread(waiting_statements, conn)
    assert "unnest(" in statement, statement


@db_sync_to_async
def log_of(session: Session) -> list[tuple[int, str, dict]]:
    return list(
        Event.objects.filter(session=session).order_by("seq").values_list("seq", "kind", "data")
    )


@postgresql_only
async def test_one_batch_keeps_each_session_s_order_its_turn_and_its_prompt(owner):
    (held, _), *rest = await leased(owner, 5)
    (s1, f1), (s2, f2), (s3, f3), (s4, f4) = rest
    # s2 has a turn running, which its batch ends.
    await writer.append(s2.pk, [("user_message", {"text": "go"})], client_id="p0", fence=f2)
    appends = [
        (s1, [chunk("a")], None, f1),
        (s2, [chunk("last words")], None, f2),
        (s1, [chunk("b")], None, f1),
        (s3, [("user_message", {"text": "hi"})], "p1", f3),
        (s2, [("turn_end", {"stop_reason": "end_turn"})], None, f2),
        (s3, [chunk("answer")], None, f3),
        (s4, [chunk("x"), ("session_title", {"title": "named"})], None, f4),
        (s1, [chunk("c"), chunk("d")], None, f1),
    ]
    watcher = other_connection()
    try:
        watcher.execute("SELECT 1 FROM craft_lease WHERE session_id = %s FOR UPDATE", [s1.pk])
        async with one_batch((held, (workers.me().key, 1))):
            futures = [
                writer.submit(s.pk, events, client_id=client_id, fence=fence)
                for s, events, client_id, fence in appends
            ]
        await the_statement_for_many_sessions_waits_for(watcher)
        watcher.rollback()
    finally:
        watcher.close()
    results = await asyncio.gather(*futures)

    texts = lambda log: [(seq, d.get("content", {}).get("text", kind)) for seq, kind, d in log]  # noqa: E731
    assert texts(await log_of(s1)) == [(1, "a"), (2, "b"), (3, "c"), (4, "d")]
    assert texts(await log_of(s2)) == [(1, "user_message"), (2, "last words"), (3, "turn_end")]
    assert texts(await log_of(s3)) == [(1, "user_message"), (2, "answer")]
    assert texts(await log_of(s4)) == [(1, "x"), (2, "session_title")]
    # What each caller got back matches what was stored.
    assert [(r.first_seq, r.last_seq) for r in results] == [
        (1, 1), (2, 2), (2, 2), (1, 1), (3, 3), (2, 2), (1, 2), (3, 4)
    ]  # fmt: skip
    assert '"seq":3' in results[7].frames[0].replace(" ", "")
    turns = await db_sync_to_async(
        lambda: {t.session_id: (t.state, t.prompt_seq) for t in TurnRecord.objects.all()}
    )()
    assert turns == {s2.pk: ("ended", 1), s3.pk: ("running", 1)}
    last_seqs = await db_sync_to_async(
        lambda: dict(Session.objects.filter(pk__in=[s1.pk, s4.pk]).values_list("pk", "last_seq"))
    )()
    assert last_seqs == {s1.pk: 4, s4.pk: 2}


@postgresql_only
@pytest.mark.parametrize("takeover_commits", [True, False], ids=["commits", "rolls-back"])
async def test_a_batch_that_waited_for_a_takeover_refuses_only_that_session(
    owner, takeover_commits
):
    (held, held_fence), (s1, f1), (s2, f2), (s3, f3) = await leased(owner, 4)
    takeover = other_connection()
    try:
        takeover.execute(
            "UPDATE craft_lease SET owner = %s, token = token + 1 WHERE session_id = %s",
            ["another-worker", s2.pk],
        )
        async with one_batch((held, held_fence)):
            futures = [
                writer.submit(s.pk, [chunk(s.title)], fence=fence)
                for s, fence in ((s1, f1), (s2, f2), (s3, f3))
            ]
        await the_statement_for_many_sessions_waits_for(takeover)
        assert not any(future.done() for future in futures)
        takeover.commit() if takeover_commits else takeover.rollback()
        results = await asyncio.gather(*futures, return_exceptions=True)
    finally:
        takeover.close()

    if takeover_commits:
        assert isinstance(results[1], Fenced)
        assert await log_of(s2) == []
    else:
        assert (results[1].first_seq, results[1].last_seq) == (1, 1)
        assert len(await log_of(s2)) == 1
    for result, session in ((results[0], s1), (results[2], s3)):
        assert (result.first_seq, result.last_seq) == (1, 1)
        assert [data["content"]["text"] for _, _, data in await log_of(session)] == [session.title]


@contextlib.contextmanager
def pipeline_states() -> Iterator[list[tuple[str, bool]]]:
    """Note, for every statement Django's cursors run meanwhile, whether its connection was
    in pipeline mode (sent without waiting for the answers before it)."""
    from django.db.backends.utils import CursorWrapper

    seen: list[tuple[str, bool]] = []
    execute = CursorWrapper.execute

    def noted(self, sql, params=None):
        pgconn = self.db.connection.pgconn
        seen.append((str(sql), pgconn.pipeline_status != psycopg.pq.PipelineStatus.OFF))
        return execute(self, sql, params)

    CursorWrapper.execute = noted
    try:
        yield seen
    finally:
        CursorWrapper.execute = execute


def prompt(text: str) -> list[tuple[str, dict]]:
    return [("user_message", {"text": text})]


@postgresql_only
async def test_many_sessions_prompts_are_numbered_together_and_turn_ends_pipelined(owner):
    """A burst of prompts of many sessions is numbered, stored and their turns started by
    the many-sessions statement; what is left (a turn's end, a prompt sent again) is one
    statement per session, all sent before any answer is read: one round trip. What each
    caller gets back, and each session's turn, are as they were one statement at a time; a
    prompt already stored is not stored again."""
    (held, held_fence), (s1, f1), (s2, f2), (s3, f3), (s4, f4) = await leased(owner, 5)
    await writer.append(s3.pk, prompt("earlier"), client_id="s3-p", fence=f3)
    await writer.append(s4.pk, prompt("once"), client_id="s4-p", fence=f4)
    await writer.append(s4.pk, [("turn_end", {"stop_reason": "end_turn"})], fence=f4)
    appends = [
        (s1, prompt("one"), "s1-p", f1),
        (s2, prompt("two"), "s2-p", f2),
        (s3, [chunk("done"), ("turn_end", {"stop_reason": "end_turn"})], None, f3),
        (s4, prompt("once"), "s4-p", f4),  # sent again, say after a reconnect
    ]
    with pipeline_states() as seen, queries_in_every_thread() as statements:
        async with one_batch((held, held_fence)):
            futures = [
                writer.submit(s.pk, events, client_id=client_id, fence=fence)
                for s, events, client_id, fence in appends
            ]
        results = await asyncio.gather(*futures)

    many = [sql for _, sql in statements if "unnest(" in sql]
    assert len(many) == 1 and "started AS (INSERT INTO craft_turn" in many[0], statements
    stores = [pipelined for sql, pipelined in seen if sql.startswith("WITH")]
    assert stores[1:] == [True] * 2, seen  # the held append first, alone
    assert [(r.first_seq, r.last_seq) for r in results[:3]] == [(1, 1), (1, 1), (2, 3)]
    assert results[3] is None
    turns = await db_sync_to_async(
        lambda: {t.session_id: (t.state, t.prompt_seq) for t in TurnRecord.objects.all()}
    )()
    assert turns == {
        s1.pk: ("running", 1), s2.pk: ("running", 1), s3.pk: ("ended", 1), s4.pk: ("ended", 1)
    }  # fmt: skip
    assert [kind for _, kind, _ in await log_of(s4)] == ["user_message", "turn_end"]


@postgresql_only
async def test_a_fenced_session_in_a_pipelined_batch_is_refused_and_the_others_stored(owner):
    (held, held_fence), (s1, f1), (s2, f2), (s3, f3) = await leased(owner, 4)
    await db_sync_to_async(Lease.objects.filter(pk=s2.pk).update)(
        owner="another-worker", token=F("token") + 1
    )
    async with one_batch((held, held_fence)):
        futures = [
            writer.submit(s.pk, prompt(s.title), client_id=f"{s.title}-p", fence=fence)
            for s, fence in ((s1, f1), (s2, f2), (s3, f3))
        ]
    results = await asyncio.gather(*futures, return_exceptions=True)

    assert isinstance(results[1], Fenced)
    assert await log_of(s2) == []
    for result, session in ((results[0], s1), (results[2], s3)):
        assert (result.first_seq, result.last_seq) == (1, 1)
        assert [data["text"] for _, _, data in await log_of(session)] == [session.title]
    running = await db_sync_to_async(
        lambda: set(TurnRecord.objects.filter(state="running").values_list("session_id", flat=True))
    )()
    assert running == {s1.pk, s3.pk}


@postgresql_only
async def test_a_statement_failing_in_a_batch_costs_only_its_own_job(owner):
    """A session with a turn running cannot start a second one (its TurnRecord row's constraint):
    the many-sessions statement that starts the batch's turns fails, the batch is rolled
    back, and its jobs are stored one at a time, so only that prompt is refused."""
    (held, held_fence), (s1, f1), (s2, f2) = await leased(owner, 3)
    await writer.append(s1.pk, prompt("running"), client_id="s1-first", fence=f1)
    with queries_in_every_thread() as seen:
        async with one_batch((held, held_fence)):
            futures = [
                writer.submit(s1.pk, prompt("second"), client_id="s1-second", fence=f1),
                writer.submit(s2.pk, prompt("fine"), client_id="s2-first", fence=f2),
            ]
        results = await asyncio.gather(*futures, return_exceptions=True)

    assert any("started AS (INSERT INTO craft_turn" in sql for _, sql in seen), seen
    assert isinstance(results[0], IntegrityError), results[0]
    assert (results[1].first_seq, results[1].last_seq) == (1, 1)
    assert [data["text"] for _, _, data in await log_of(s1)] == ["running"]
    assert [data["text"] for _, _, data in await log_of(s2)] == ["fine"]


@pytest.mark.skipif(not SQLITE, reason="the run on SQLite")
async def test_on_sqlite_a_batch_keeps_each_session_s_order_and_refuses_a_stale_fence(owner):
    (s1, f1), (s2, f2), (s3, f3) = await leased(owner, 3)
    await db_sync_to_async(Lease.objects.filter(pk=s3.pk).update)(token=F("token") + 1)
    appends = [(s1, "a", f1), (s2, "x", f2), (s3, "lost", f3), (s1, "b", f1), (s2, "y", f2)]
    # The write lock is held while all are submitted: the writer forms at most one batch
    # before the last is queued, and the rest (two sessions at least) make the next.
    lock = sqlite3.connect(settings.DATABASES["default"]["NAME"])
    try:
        with queries_in_every_thread() as seen:
            lock.execute("BEGIN IMMEDIATE")
            futures = [
                writer.submit(s.pk, [chunk(text)], fence=fence) for s, text, fence in appends
            ]
            lock.rollback()
            results = await asyncio.gather(*futures, return_exceptions=True)
    finally:
        lock.close()

    assert any("WITH input(id, count)" in sql for _, sql in seen), seen
    assert isinstance(results[2], Fenced)
    assert [(r.first_seq, r.last_seq) for r in (results[0], results[3])] == [(1, 1), (2, 2)]
    assert [(r.first_seq, r.last_seq) for r in (results[1], results[4])] == [(1, 1), (2, 2)]
    texts = lambda log: [data["content"]["text"] for _, _, data in log]  # noqa: E731
    assert texts(await log_of(s1)) == ["a", "b"]
    assert texts(await log_of(s2)) == ["x", "y"]
    assert await log_of(s3) == []


@contextlib.contextmanager
def sqlite_write_lock_held() -> Iterator[None]:
    """What is submitted inside waits for SQLite's write lock, held by another connection,
    and so is committed in at most two batches (the writer may take the first before the
    rest is queued)."""
    lock = sqlite3.connect(settings.DATABASES["default"]["NAME"])
    try:
        lock.execute("BEGIN IMMEDIATE")
        yield
        lock.rollback()
    finally:
        lock.close()


@pytest.mark.skipif(not SQLITE, reason="the run on SQLite")
async def test_on_sqlite_many_sessions_prompts_are_stored_together(owner):
    """A burst of prompts of many sessions is looked up, numbered, inserted and their turns
    started in a few statements for all of them; a prompt stored before is not stored again;
    what each caller gets back, and each session's turn, are as one prompt at a time."""
    (s1, f1), (s2, f2), (s3, f3), (s5, f5) = await leased(owner, 4)
    await writer.append(s3.pk, prompt("earlier"), client_id="s3-p", fence=f3)
    await writer.append(s3.pk, [("turn_end", {"stop_reason": "end_turn"})], fence=f3)
    await writer.append(s5.pk, [chunk("before")], fence=f5)
    appends = [
        (s1, prompt("one"), "s1-p", f1),
        (s2, prompt("two"), "s2-p", f2),
        (s3, prompt("earlier"), "s3-p", f3),  # sent again, say after a reconnect
        (s5, prompt("five"), "s5-p", f5),
        (s1, [chunk("answer")], None, f1),
    ]
    with queries_in_every_thread() as seen:
        with sqlite_write_lock_held():
            futures = [
                writer.submit(s.pk, events, client_id=client_id, fence=fence)
                for s, events, client_id, fence in appends
            ]
        results = await asyncio.gather(*futures, return_exceptions=True)

    statements = [sql for _, sql in seen]
    assert any(sql.startswith("WITH prompt(session_id, client_id)") for sql in statements)
    assert any(sql.startswith("INSERT INTO craft_turn") for sql in statements)
    # Only the repeated prompt was looked up on its own (the batch was not stored job by job).
    assert sum("AND client_id = %s LIMIT 1" in sql for sql in statements) == 1, statements
    assert [(r.first_seq, r.last_seq) for r in (results[0], results[1], results[3])] == [
        (1, 1), (1, 1), (2, 2)
    ]  # fmt: skip
    assert results[2] is None
    assert (results[4].first_seq, results[4].last_seq) == (2, 2)
    texts = lambda log: [  # noqa: E731
        d.get("text") or d.get("content", {}).get("text", kind) for _, kind, d in log
    ]
    assert texts(await log_of(s1)) == ["one", "answer"]
    assert texts(await log_of(s3)) == ["earlier", "turn_end"]
    assert texts(await log_of(s5)) == ["before", "five"]
    turns = await db_sync_to_async(
        lambda: {t.session_id: (t.state, t.prompt_seq, t.worker) for t in TurnRecord.objects.all()}
    )()
    me = workers.me().key
    assert turns == {
        s1.pk: ("running", 1, me), s2.pk: ("running", 1, me), s3.pk: ("ended", 1, me),
        s5.pk: ("running", 2, me),
    }  # fmt: skip
    # Their client ids were stored: sent again, they are found.
    assert await writer.append(s2.pk, prompt("two"), client_id="s2-p", fence=f2) is None


@pytest.mark.skipif(not SQLITE, reason="the run on SQLite")
async def test_on_sqlite_a_prompt_of_a_session_with_a_turn_running_costs_only_its_own_job(owner):
    """A session with a turn running cannot start a second one (its TurnRecord row's constraint):
    the statement starting the burst's turns fails, the batch is rolled back, and its jobs
    are stored one at a time, so only that prompt is refused; so is a prompt whose lease was
    taken over."""
    (s1, f1), (s2, f2), (s3, f3), (s4, f4) = await leased(owner, 4)
    await db_sync_to_async(Lease.objects.filter(pk=s4.pk).update)(token=F("token") + 1)
    await writer.append(s1.pk, prompt("running"), client_id="s1-first", fence=f1)
    with queries_in_every_thread() as seen:
        with sqlite_write_lock_held():
            futures = [
                writer.submit(s1.pk, prompt("second"), client_id="s1-second", fence=f1),
                writer.submit(s2.pk, prompt("fine"), client_id="s2-first", fence=f2),
                writer.submit(s3.pk, prompt("also"), client_id="s3-first", fence=f3),
                writer.submit(s4.pk, prompt("lost"), client_id="s4-first", fence=f4),
            ]
        results = await asyncio.gather(*futures, return_exceptions=True)

    assert any(sql.startswith("WITH prompt(session_id, client_id)") for _, sql in seen)
    assert isinstance(results[0], IntegrityError), results[0]
    assert [(r.first_seq, r.last_seq) for r in results[1:3]] == [(1, 1), (1, 1)]
    assert isinstance(results[3], Fenced)
    assert await log_of(s4) == []
    assert [data["text"] for _, _, data in await log_of(s1)] == ["running"]
    assert [data["text"] for _, _, data in await log_of(s2)] == ["fine"]
    running = await db_sync_to_async(
        lambda: dict(
            TurnRecord.objects.filter(state="running").values_list("session_id", "prompt_seq")
        )
    )()
    assert running == {s1.pk: 1, s2.pk: 1, s3.pk: 1}


@runs_the_module_on_sqlite
async def test_the_batches_hold_on_sqlite(tmp_path):
    output = await asyncio.to_thread(
        run_again_on_sqlite, __file__, tmp_path, deselect="test_the_batches_hold_on_sqlite"
    )
    assert "3 passed" in output, output[-2000:]  # the three SQLite tests ran
