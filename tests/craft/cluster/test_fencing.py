"""The event log's fence, against a takeover that is in progress while an append arrives.

The takeover runs on a connection of its own and holds the lease row in an open
transaction; the writer's append with the old token must wait for it and then see its
result, whatever the result is.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import psycopg
import pytest
from django.conf import settings
from django.utils import timezone

from craft.cluster import leases
from craft.models import Event, Lease, Session, Worker
from craft.storage import workers
from craft.storage.db import db_sync_to_async
from craft.storage.eventlog import Fenced, writer
from tests.ready import open_ready_session

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


def other_connection() -> psycopg.Connection:
    db = settings.DATABASES["default"]
    return psycopg.connect(
        host=db["HOST"], port=db["PORT"], user=db["USER"], dbname=db["NAME"],
        application_name="takeover",
    )  # fmt: skip


def waiting_for_a_lock(conn: psycopg.Connection) -> bool:
    """True once some other backend waits for a lock that `conn`'s transaction holds."""
    with psycopg.connect(conn.info.dsn, autocommit=True) as probe:
        row = probe.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
            [conn.info.backend_pid],
        ).fetchone()
    return bool(row and row[0])


async def until(condition, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(condition):
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.02)


async def leased_session(owner, title: str) -> tuple[Session, Lease]:
    session = await db_sync_to_async(open_ready_session)(owner, title)
    lease = await db_sync_to_async(Lease.objects.create)(
        session_id=session.pk, owner=workers.me().key, expires_at=timezone.now()
    )
    return session, lease


async def stored(session: Session) -> tuple[int, int]:
    row = await db_sync_to_async(Session.objects.get)(pk=session.pk)
    count = await db_sync_to_async(Event.objects.filter(session=session).count)()
    return row.last_seq, count


@pytest.mark.parametrize("prompt", [False, True], ids=["chunk", "prompt"])
async def test_an_append_that_waited_for_a_takeover_is_refused_and_stores_nothing(owner, prompt):
    session, lease = await leased_session(owner, "taken over")
    before = await stored(session)
    takeover = other_connection()
    try:
        takeover.execute(
            "UPDATE craft_lease SET owner = %s, token = token + 1 WHERE session_id = %s",
            ["another-worker", session.pk],
        )
        kind = "user_message" if prompt else "agent_message_chunk"
        append = asyncio.ensure_future(
            writer.append(
                session.pk,
                [(kind, {"n": 1})],
                client_id="p1" if prompt else None,
                fence=(lease.owner, lease.token),
            )
        )
        await until(lambda: waiting_for_a_lock(takeover), "the append waits for the takeover")
        assert not append.done()
        takeover.commit()
        with pytest.raises(Fenced):
            await append
    finally:
        takeover.close()
    assert await stored(session) == before


async def test_an_append_that_waited_for_a_takeover_that_rolled_back_is_stored(owner):
    session, lease = await leased_session(owner, "kept")
    last_seq, count = await stored(session)
    takeover = other_connection()
    try:
        takeover.execute(
            "UPDATE craft_lease SET owner = %s, token = token + 1 WHERE session_id = %s",
            ["another-worker", session.pk],
        )
        chunks = [("agent_message_chunk", {"n": n}) for n in range(3)]
        append = asyncio.ensure_future(
            writer.append(session.pk, chunks, fence=(lease.owner, lease.token))
        )
        await until(lambda: waiting_for_a_lock(takeover), "the append waits for the takeover")
        takeover.rollback()
        result = await append
    finally:
        takeover.close()
    assert (result.first_seq, result.last_seq) == (last_seq + 1, last_seq + 3)
    assert await stored(session) == (last_seq + 3, count + 3)


async def test_a_stale_token_a_missing_lease_and_a_missing_session_are_told_apart(owner):
    session, lease = await leased_session(owner, "stale")
    before = await stored(session)
    with pytest.raises(Fenced):
        await writer.append(session.pk, [("agent_message_chunk", {})], fence=(lease.owner, 0))
    await db_sync_to_async(Lease.objects.filter(pk=session.pk).delete)()
    with pytest.raises(Fenced):
        await writer.append(
            session.pk, [("agent_message_chunk", {})], fence=(lease.owner, lease.token)
        )
    assert await stored(session) == before
    await db_sync_to_async(Session.objects.filter(pk=session.pk).delete)()
    with pytest.raises(Session.DoesNotExist):
        await writer.append(
            session.pk, [("agent_message_chunk", {})], fence=(lease.owner, lease.token)
        )


async def test_a_prompt_stored_once_is_not_stored_again(owner):
    session, lease = await leased_session(owner, "twice")
    fence = (lease.owner, lease.token)
    first = await writer.append(
        session.pk, [("user_message", {"text": "hi"})], client_id="p1", fence=fence
    )
    assert first is not None
    after_first = await stored(session)
    again = await writer.append(
        session.pk, [("user_message", {"text": "hi"})], client_id="p1", fence=fence
    )
    assert again is None
    assert await stored(session) == after_first


# --- a new session's first claim ------------------------------------------------------------


def live_worker_elsewhere(key: str) -> None:
    Worker.objects.create(id=key, host="elsewhere", boot="", pid=1, started=1)


@pytest.mark.parametrize("other_commits", [True, False], ids=["commits", "rolls-back"])
async def test_two_workers_first_claims_of_a_new_session_give_it_one_owner(owner, other_commits):
    """Another worker creates the new session's lease at the same moment, its transaction
    still open: this worker's claim waits for it, then takes it only if it rolled back."""
    session = await db_sync_to_async(open_ready_session)(owner, "first claims")
    await db_sync_to_async(live_worker_elsewhere)("another-worker")
    other = other_connection()
    try:
        other.execute(
            "INSERT INTO craft_lease (session_id, owner, token, expires_at)"
            " VALUES (%s, %s, 1, now() + interval '1 minute')",
            [session.pk, "another-worker"],
        )
        claim = asyncio.ensure_future(db_sync_to_async(leases.acquire)(session.pk))
        await until(lambda: waiting_for_a_lock(other), "the claim waits for the other's")
        assert not claim.done()
        other.commit() if other_commits else other.rollback()
        result = await claim
    finally:
        other.close()
    lease = await db_sync_to_async(Lease.objects.get)(pk=session.pk)
    if other_commits:
        assert (result.mine, result.owner) == (False, "another-worker")
        assert (lease.owner, lease.token) == ("another-worker", 1)
    else:
        assert (result.mine, result.owner, result.token) == (True, workers.me().key, 1)
        assert (lease.owner, lease.token) == (workers.me().key, 1)


async def test_a_claim_of_a_missing_session_says_so_and_leases_nothing():
    missing = uuid.uuid4()
    with pytest.raises(Session.DoesNotExist):
        await db_sync_to_async(leases.acquire)(missing)
    assert not await db_sync_to_async(Lease.objects.filter(pk=missing).exists)()
