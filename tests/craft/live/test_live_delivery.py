"""How a socket follows a session: from memory when the live notice continues where it is,
from the database when it does not. Notices are injected by hand, with frames that say where
they came from, against events written straight into the table (no notice of their own)."""

from __future__ import annotations

import asyncio
import json

import pytest
from django.db.models import F

from craft.live import delivery
from craft.models import Event, Session
from craft.storage.db import db_sync_to_async
from craft.storage.eventlog import append_events
from craft.storage.normalise import event_frame
from tests.ready import open_ready_session

from ..wsclient import open_socket, receive_until, session_cookie

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


def data(text: str) -> dict:
    return {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}


def memory_frames(first: int, last: int) -> list[str]:
    return [event_frame(seq, "agent_message_chunk", json.dumps(data("memory")))
            for seq in range(first, last + 1)]  # fmt: skip


@db_sync_to_async
def store_quietly(session_id, first: int, last: int) -> None:
    """Store events as another process would, without telling this one."""
    for seq in range(first, last + 1):
        Event.objects.create(session_id=session_id, seq=seq, kind="agent_message_chunk",
                             data=data("db"))  # fmt: skip
    Session.objects.filter(pk=session_id).update(last_seq=F("last_seq") + (last - first + 1))


@pytest.fixture
def session(owner):
    return open_ready_session(owner, "live")


async def following(session, owner, after_events: int):
    """A socket that has received events 1..after_events (stored and announced)."""
    if after_events:
        await db_sync_to_async(append_events)(
            session.pk, [("agent_message_chunk", data("db"))] * after_events
        )
    comm, _ = await open_socket(session.pk, await db_sync_to_async(session_cookie)(owner))
    await comm.send_json_to({"type": "resume", "after": 0})
    if after_events:
        await receive_until(comm, lambda f: f.get("seq") == after_events)
    (consumer,) = delivery.hub().followers.of(session.pk)
    return comm, consumer


async def received(comm, last_seq: int) -> list[tuple[int, str]]:
    frames = await receive_until(comm, lambda f: f.get("seq") == last_seq)
    assert await comm.receive_nothing(0.2)
    return [(f["seq"], f["data"]["content"]["text"]) for f in frames]


async def test_a_notice_that_continues_the_stream_is_sent_from_memory(session, owner):
    comm, consumer = await following(session, owner, 2)
    await store_quietly(session.pk, 3, 4)
    consumer.deliver(3, 4, memory_frames(3, 4))
    assert await received(comm, 4) == [(3, "memory"), (4, "memory")]
    await comm.disconnect()


async def test_a_notice_that_overlaps_what_was_sent_sends_only_the_rest(session, owner):
    comm, consumer = await following(session, owner, 4)
    await store_quietly(session.pk, 5, 6)
    consumer.deliver(3, 6, memory_frames(3, 6))
    assert await received(comm, 6) == [(5, "memory"), (6, "memory")]
    await comm.disconnect()


async def test_a_notice_after_a_gap_makes_the_socket_read_the_database(session, owner):
    comm, consumer = await following(session, owner, 2)
    await store_quietly(session.pk, 3, 6)
    consumer.deliver(5, 6, memory_frames(5, 6))
    assert await received(comm, 6) == [(3, "db"), (4, "db"), (5, "db"), (6, "db")]
    await comm.disconnect()


async def test_a_doorbell_without_frames_makes_the_socket_read_the_database(session, owner):
    comm, consumer = await following(session, owner, 1)
    await store_quietly(session.pk, 2, 3)
    await consumer.events_available({"type": "events.available", "last_seq": 3, "origin": "x"})
    assert await received(comm, 3) == [(2, "db"), (3, "db")]
    await comm.disconnect()


async def test_the_own_doorbell_is_ignored_because_memory_already_delivered(session, owner):
    comm, consumer = await following(session, owner, 1)
    await store_quietly(session.pk, 2, 2)
    await consumer.events_available(
        {"type": "events.available", "last_seq": 2, "origin": delivery.PROCESS_ID}
    )
    assert await comm.receive_nothing(0.3)
    await comm.disconnect()


async def test_notices_before_resume_send_nothing(session, owner):
    comm, _ = await open_socket(session.pk, await db_sync_to_async(session_cookie)(owner))
    (consumer,) = delivery.hub().followers.of(session.pk)
    await store_quietly(session.pk, 1, 1)
    consumer.deliver(1, 1, memory_frames(1, 1))
    await asyncio.sleep(0.05)
    assert await comm.receive_nothing(0.2)
    await comm.disconnect()
