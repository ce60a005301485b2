"""How many queries the hot paths cost, counted in every thread (the writer's, the database
threads'), so that an N+1 or a read that creeps onto a follow-up fails here first."""

from __future__ import annotations

import re
from collections import Counter

import pytest
from django.utils import timezone

from craft.models import Event, Lease, TurnRecord, Worker
from craft.storage import workers
from craft.storage.db import db_sync_to_async
from craft.storage.eventlog import ONE_STATEMENT_ROWS, writer
from tests.conftest import queries_in_every_thread
from tests.ready import open_ready_session

from ..wsclient import is_turn_end, open_socket, receive_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

WHAT = [
    ("WITH fence AS", "store"),
    ("WITH bump AS", "store"),
    ("SELECT craft_lease.owner, craft_lease.token, craft_worker.id FROM craft_lease", "fence"),
    ("UPDATE craft_session SET last_seq", "seq"),
    ("COPY craft_event", "events"),
    ("INSERT INTO craft_event", "events"),
    ('INSERT INTO "craft_worker"', "worker"),
    ("INSERT INTO craft_turn", "turn starts"),
    ("UPDATE craft_turn", "turn ends"),
    ("SELECT 1 FROM craft_event WHERE session_id = %s AND client_id", "prompt seen"),
]


def what(seen: list[tuple[str, str]]) -> Counter[str]:
    """Name each query by what it does (unknown ones by their SQL)."""
    named = (next((name for start, name in WHAT if sql.startswith(start)), sql) for _, sql in seen)
    return Counter(name for name in named if name.split()[0] not in ("BEGIN", "COMMIT"))


@pytest.mark.parametrize("size", [1, ONE_STATEMENT_ROWS, ONE_STATEMENT_ROWS + 1, 500])
async def test_the_event_writer_stores_a_batch_in_one_query_or_a_large_one_in_three(owner, size):
    session = await db_sync_to_async(open_ready_session)(owner, "writer")
    lease = await db_sync_to_async(Lease.objects.create)(
        session_id=session.pk, owner=workers.me().key, expires_at=timezone.now()
    )
    events = [("agent_message_chunk", {"n": n}) for n in range(size)]
    with queries_in_every_thread() as seen:
        await writer.append(session.pk, events, fence=(lease.owner, lease.token))
    assert {thread for thread, _ in seen} == {"craft-event-writer"}
    # The lease read (fencing), the session's seq bump and the rows: one statement for a few
    # rows, three for many (the rows then go by COPY).
    if size <= ONE_STATEMENT_ROWS:
        assert what(seen) == Counter(["store"])
    else:
        assert what(seen) == Counter(["fence", "seq", "events"])
    stored = await db_sync_to_async(list)(
        Event.objects.filter(session=session).order_by("seq").values_list("seq", "data")
    )
    assert stored == [(seq, {"n": seq - 1}) for seq in range(1, size + 1)]


async def test_a_cached_follow_up_reads_nothing_and_writes_only_the_log(owner, cookie):
    session = await db_sync_to_async(open_ready_session)(owner, "follow-up")
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    await comm.send_json_to({"type": "prompt", "id": "first", "text": "pid"})
    await receive_until(comm, is_turn_end)  # the agent is started and cached now

    with queries_in_every_thread() as seen:
        await comm.send_json_to({"type": "prompt", "id": "again", "text": "pid"})
        await receive_until(comm, is_turn_end)
    # Everything goes through the event writer: no lookup of the session, the sandbox or the
    # lease on the database threads.
    assert {thread for thread, _ in seen} == {"craft-event-writer"}
    done = what(seen)
    # Each commit is one statement: its prompt check, fence, seq bump and rows, and the
    # prompt's starts the turn's row (the fence's read said the worker's row exists), the
    # turn_end's ends it. The reply, the agent's usage_update and the end are one to three
    # commits, as the writer finds them waiting (on a busy machine, one each).
    commits = done["store"]
    assert commits in (2, 3, 4)
    assert done == Counter(["store"] * commits)
    prompts = await db_sync_to_async(list)(
        Event.objects.filter(session=session, kind="user_message").values_list("seq", flat=True)
    )
    turns = await db_sync_to_async(list)(
        TurnRecord.objects.filter(session=session)
        .order_by("prompt_seq")
        .values_list("prompt_seq", "state", "stop_reason", "pending")
    )
    assert turns == [(seq, TurnRecord.State.ENDED, "end_turn", {}) for seq in prompts]
    await comm.disconnect()


async def test_a_prompt_writes_its_worker_row_back_when_it_is_missing(owner):
    """A turn's worker must be known, or the other workers take it for gone and close its
    turns: a prompt stored while this worker's row is missing writes it again."""
    session = await db_sync_to_async(open_ready_session)(owner, "no worker row")
    lease = await db_sync_to_async(Lease.objects.create)(
        session_id=session.pk, owner=workers.me().key, expires_at=timezone.now()
    )
    await db_sync_to_async(Worker.objects.filter(pk=workers.me().key).delete)()
    with queries_in_every_thread() as seen:
        await writer.append(
            session.pk, [("user_message", {"text": "hi"})], client_id="p1",
            fence=(lease.owner, lease.token),
        )  # fmt: skip
    assert what(seen) == Counter(["store", "worker"])
    turn = await db_sync_to_async(TurnRecord.objects.get)(session=session)
    assert turn.state == TurnRecord.State.RUNNING and turn.worker == workers.me().key
    assert await db_sync_to_async(Worker.objects.filter(pk=workers.me().key).exists)()


def reads_of(seen: list[tuple[str, str]]) -> Counter[str]:
    """Name each read by the table of its outer FROM (subqueries are skipped)."""
    tables: Counter[str] = Counter()
    for _, sql in seen:
        if not sql.startswith("SELECT"):
            continue
        while (outer := re.sub(r"\([^()]*\)", "", sql)) != sql:
            sql = outer
        tables[sql.split(" FROM ", 1)[1].split()[0].strip('"')] += 1
    return tables


async def test_opening_a_session_reads_each_row_it_needs_once(owner, cookie):
    """A new session's socket and first prompt (until its turn ends) read the account, the
    session and its sandbox no more often than each step needs them."""
    session = await db_sync_to_async(open_ready_session)(owner, "opening")
    with queries_in_every_thread() as seen:
        comm, _ = await open_socket(session.pk, cookie)
        await comm.send_json_to({"type": "resume", "after": 0})
        await comm.send_json_to({"type": "prompt", "id": "first", "text": "pid"})
        await receive_until(comm, is_turn_end)
    await comm.disconnect()
    reads = reads_of(seen)
    # The account: at the handshake, and once more after the socket joined its group (a
    # sign-out in between is seen). The session: the socket's, the prompt's (with its
    # sandbox and its owner's keys) and the agent start's (likewise). The sandbox alone: the
    # first checkpoint's workspace. A new session's lease is one statement, a write.
    tables = ("django_session", "auth_user", "craft_session", "sandboxes_sandbox", "craft_lease")
    assert {table: reads[table] for table in tables} == {
        "django_session": 2, "auth_user": 2, "craft_session": 3, "sandboxes_sandbox": 1,
        "craft_lease": 0,
    }  # fmt: skip
    assert sum(sql.startswith("SAVEPOINT") for _, sql in seen) == 0
