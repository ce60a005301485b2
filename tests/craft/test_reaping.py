"""Each server process reaps on its own: idle agents, and sandbox leftovers.

A real daphne process (`daphne craft.asgi:application`), real agents, the real database.
"""

from __future__ import annotations

import signal
import uuid

import pytest
from django.conf import settings

from sandboxes.models import ReaperAction
from tests.ready import open_ready_session

from ..procs import alive
from ..server import Daphne, Socket
from .turns.test_restarts import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def server(tmp_path):
    daphne = Daphne(tmp_path, CRAFT_AGENT_IDLE_SECONDS="1", CRAFT_REAPER_INTERVAL_SECONDS="2")
    yield daphne.start()
    daphne.stop()


def test_a_server_stops_idle_agents_and_removes_orphans_on_its_own(server, owner):
    session = open_ready_session(owner, "left idle")
    orphan = settings.CRAFT_SANDBOX_ROOT / str(uuid.uuid4())
    orphan.mkdir()
    sock = Socket(server, owner, session.pk)
    try:
        sock.send({"type": "resume", "after": 0})
        sock.send({"type": "prompt", "id": "p1", "text": "pid"})
        frames = sock.until(lambda f: f.get("kind") == "turn_end")
        (reply,) = [
            f["data"]["content"]["text"] for f in frames if f.get("kind") == "agent_message_chunk"
        ]
        pid = int(reply.split()[1])

        wait_for(lambda: not alive(pid), what="the idle agent to be stopped")
        stopped = ReaperAction.objects.filter(kind=ReaperAction.Kind.STOPPED_IDLE_AGENT)
        action = wait_for(stopped.first, what="the stop to be recorded")
        assert (action.sandbox_id, action.target) == (session.sandbox_id, f"session {session.pk}")
        wait_for(lambda: not orphan.exists(), what="the orphan folder to be removed")

        # The session goes on with a new agent.
        sock.send({"type": "prompt", "id": "p2", "text": "pid"})
        frames = sock.until(lambda f: f.get("kind") == "turn_end")
        assert frames[-1]["data"] == {"stop_reason": "end_turn"}
        (reply,) = [
            f["data"]["content"]["text"] for f in frames if f.get("kind") == "agent_message_chunk"
        ]
        assert int(reply.split()[1]) != pid
    finally:
        sock.close()
    server.signal(signal.SIGTERM)
    assert server.wait(30) == 0
