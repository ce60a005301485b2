"""How many queries the hot paths cost, counted in every thread (the writer's, the database
threads'), so that an N+1 or a read that creeps onto a follow-up fails here first."""

from __future__ import annotations

from collections import Counter

import pytest
from django.utils import timezone

from craft.cluster import workers
from craft.models import Lease
from craft.storage.db import db_sync_to_async
from craft.storage.eventlog import writer
from tests.conftest import queries_in_every_thread
from tests.ready import open_ready_session

from .wsclient import is_turn_end, open_socket, receive_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

WHAT = [
    ("SELECT owner, token FROM craft_lease", "fence"),
    ("UPDATE craft_session SET last_seq", "seq"),
    ("COPY craft_event", "events"),
    ("INSERT INTO craft_event", "events"),
    ('INSERT INTO "craft_worker"', "worker"),
    ('INSERT INTO "craft_turn"', "turn starts"),
    ('UPDATE "craft_turn"', "turn ends"),
    ('SELECT %s AS "a" FROM "craft_event" WHERE ("craft_event"."client_id"', "prompt seen"),
]


def what(seen: list[tuple[str, str]]) -> Counter[str]:
    """Name each query by what it does (unknown ones by their SQL)."""
    named = (next((name for start, name in WHAT if sql.startswith(start)), sql) for _, sql in seen)
    return Counter(name for name in named if name.split()[0] not in ("BEGIN", "COMMIT"))


@pytest.mark.parametrize("size", [1, 500])
async def test_the_event_writer_stores_a_batch_in_three_queries_whatever_its_size(owner, size):
    session = await db_sync_to_async(open_ready_session)(owner, "writer")
    lease = await db_sync_to_async(Lease.objects.create)(
        session_id=session.pk, owner=workers.me().key, expires_at=timezone.now()
    )
    events = [("agent_message_chunk", {"n": n}) for n in range(size)]
    with queries_in_every_thread() as seen:
        await writer.append(session.pk, events, fence=(lease.owner, lease.token))
    assert {thread for thread, _ in seen} == {"craft-event-writer"}
    # The lease read (fencing), the session's seq bump, the rows in one statement.
    assert what(seen) == Counter(["fence", "seq", "events"])


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
    # The prompt's commit checks its id, registers the worker (a no-op) and starts the turn's
    # row; the turn_end's commit ends it. The reply, the agent's usage_update and the end are
    # one to three commits, as the writer finds them waiting (on a busy machine, one each).
    commits = done["seq"]
    assert commits in (2, 3, 4)
    per_commit = Counter(["fence", "seq", "events"] * commits)
    assert done == per_commit + Counter(["prompt seen", "worker", "turn starts", "turn ends"])
    await comm.disconnect()
