"""With Redis as the channel layer, events committed by another process reach this one's sockets.

That is what lets several server processes share sessions' event streams: the process that
stores events rings the doorbell through Redis, and a socket held by another process reads
the events from the shared database.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest
from channels.layers import channel_layers, get_channel_layer
from django.conf import settings as django_settings

from craft.storage.db import db_sync_to_async
from tests.conftest import REDIS_URL
from tests.ready import open_ready_session

from ..wsclient import open_socket, receive_until, session_cookie

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

WRITER = """
import django, sys, uuid
django.setup()
from craft.storage.eventlog import append_events
session_id = uuid.UUID(sys.argv[1])
for batch in range(5):
    append_events(session_id, [("agent_message_chunk", {"n": batch * 2 + i}) for i in range(2)])
"""


def write_from_another_process(session_id) -> None:
    db = django_settings.DATABASES["default"]
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "REDIS_URL": REDIS_URL,
    }
    subprocess.run(
        [sys.executable, "-c", WRITER, str(session_id)],
        env=env, cwd=django_settings.BASE_DIR, check=True, timeout=60,
    )  # fmt: skip


async def test_events_stored_by_another_process_arrive_live(redis_layer, owner):
    session = await db_sync_to_async(open_ready_session)(owner)
    comm, _ = await open_socket(session.pk, await db_sync_to_async(session_cookie)(owner))
    await comm.send_json_to({"type": "resume", "after": 0})
    assert await comm.receive_nothing(0.2)
    await asyncio.to_thread(write_from_another_process, session.pk)
    frames = await receive_until(comm, lambda f: f.get("seq") == 10)
    assert [f["seq"] for f in frames] == list(range(1, 11))
    assert [f["data"]["n"] for f in frames] == list(range(10))
    await comm.disconnect()


async def test_more_doorbells_at_once_than_connections_wait_their_turn(redis_layer, settings):
    # A pool of 2 connections; 40 sessions' doorbells at once. redis-py's own pool fails the
    # third with "Too many connections" (at 100 that was a few hundred sessions streaming).
    settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"][0]["max_connections"] = 2
    channel_layers.backends.clear()
    layer = get_channel_layer()
    channels = [await layer.new_channel() for _ in range(40)]
    for n, channel in enumerate(channels):
        await layer.group_add(f"doorbells-{n}", channel)
    await asyncio.gather(
        *(layer.group_send(f"doorbells-{n}", {"type": "ring", "n": n}) for n in range(40))
    )
    for n, channel in enumerate(channels):
        assert (await layer.receive(channel))["n"] == n
        await layer.group_discard(f"doorbells-{n}", channel)
