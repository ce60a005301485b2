"""A Turn is one prompt's: it ends exactly once, and nothing of it reaches the next prompt's."""

from __future__ import annotations

import pytest
from django.conf import settings

from craft.storage.db import db_sync_to_async
from craft.turns import runner as runner_module
from craft.turns.registry import runners
from sandboxes.models import Sandbox
from tests.ready import open_ready_session

from ..cluster.test_fencing import other_connection, until
from ..logs import stored_log
from ..wsclient import is_turn_end, open_socket, receive_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture
def session(owner):
    return open_ready_session(owner, "turns")


async def test_a_turn_ends_once_even_when_asked_again(session, cookie):
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    await comm.send_json_to({"type": "prompt", "id": "p1", "text": "hello"})
    await receive_until(comm, is_turn_end)
    turn = runners.get(session.pk).turn
    assert turn is not None and turn.ended
    await turn.end([("agent_error", {"message": "a second end"})], "error")
    kinds = [kind for _, kind, _ in await stored_log(session)]
    assert kinds.count("turn_end") == 1
    assert "agent_error" not in kinds
    await comm.disconnect()


async def test_each_prompt_gets_a_turn_of_its_own(session, cookie):
    """A cancelled turn that waited on a permission leaves nothing to the next one (what was
    reset by hand at each prompt before)."""
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    await comm.send_json_to({"type": "prompt", "id": "p1", "text": "write a.txt x"})
    await receive_until(comm, lambda f: f.get("kind") == "permission_request")
    first = runners.get(session.pk).turn
    assert first is not None and first.pending
    await comm.send_json_to({"type": "cancel"})
    frames = await receive_until(comm, is_turn_end)
    assert frames[-1]["data"] == {"stop_reason": "cancelled"}
    assert first.cancel_requested and not first.pending

    await comm.send_json_to({"type": "prompt", "id": "p2", "text": "hello"})
    frames = await receive_until(comm, is_turn_end)
    assert frames[-1]["data"] == {"stop_reason": "end_turn"}
    second = runners.get(session.pk).turn
    assert second is not first
    assert not second.cancel_requested and second.interrupted is None and not second.pending
    log = await stored_log(session)
    assert [kind for _, kind, _ in log].count("turn_end") == 2
    await comm.disconnect()


@pytest.mark.skipif(
    settings.DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3",
    reason="holds the sandbox's row with PostgreSQL's row lock",
)
async def test_a_turn_does_not_wait_for_its_sandbox_activity_to_be_written(
    session, cookie, monkeypatch
):
    """The sandbox's activity time (what idle reaping reads) is written beside a turn, not
    ahead of it: with the sandbox's row locked by another transaction, the agent still gets
    the prompt and answers; the time moves once the lock is gone."""
    monkeypatch.setattr(runner_module, "ACTIVITY_EVERY", 0.0)

    def read_activity():
        rows = Sandbox.objects.filter(pk=session.sandbox_id)
        return rows.values_list("last_activity_at", flat=True).get()

    activity = db_sync_to_async(read_activity)
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    await comm.send_json_to({"type": "prompt", "id": "a1", "text": "hello"})
    await receive_until(comm, is_turn_end)  # the agent started: its runner knows the sandbox
    blocker = other_connection()
    try:
        blocker.execute(
            f"SELECT 1 FROM {Sandbox._meta.db_table} WHERE id = %s FOR UPDATE",
            [session.sandbox_id],
        )
        before = await activity()
        await comm.send_json_to({"type": "prompt", "id": "a2", "text": "hello again"})
        frames = await receive_until(comm, is_turn_end)
        assert frames[-1]["data"] == {"stop_reason": "end_turn"}
        assert await activity() == before  # its write waits for the lock, beside the turn
        blocker.rollback()
        await until(lambda: read_activity() != before, "the activity written")
    finally:
        blocker.close()
    await comm.disconnect()
