"""A Turn is one prompt's: it ends exactly once, and nothing of it reaches the next prompt's."""

from __future__ import annotations

import pytest

from craft.turns.registry import runners
from tests.ready import open_ready_session

from .logs import stored_log
from .wsclient import is_turn_end, open_socket, receive_until

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
