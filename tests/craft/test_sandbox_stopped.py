"""A session whose sandbox is stopped says who stopped it, and goes on at the next message.

Staff terminate a sandbox in the admin (`terminate_sandbox(by_staff=True)`), its owner with
`DELETE /api/sandbox/`: a turn running in it ends `interrupted` with an `agent_error` whose
reason says which (never `cancelled`, as if the person had pressed Stop), and the session's
next prompt moves it to a new sandbox, its log intact, with a new agent.
"""

from __future__ import annotations

import pytest

from craft.models import Event, Session
from craft.storage.db import db_sync_to_async
from sandboxes import services as sandbox_services
from sandboxes.models import Sandbox
from tests.ready import open_ready_session

from .wsclient import events_of, is_turn_end, open_socket, receive_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture
def session(owner):
    return open_ready_session(owner, "stopped")


async def stop_during_a_turn(comm, session, **how):
    await comm.send_json_to({"type": "resume", "after": 0})
    await comm.send_json_to({"type": "prompt", "id": "p1", "text": "slow 200 0.05"})
    await receive_until(comm, lambda f: f.get("kind") == "agent_message_chunk")
    await db_sync_to_async(sandbox_services.terminate_sandbox)(session.sandbox, **how)
    return events_of(await receive_until(comm, is_turn_end))


@pytest.mark.parametrize(
    ("how", "reason", "message"),
    [
        ({"by_staff": True}, "sandbox_stopped_by_staff", "An administrator stopped"),
        ({}, "sandbox_stopped", "This session's sandbox was stopped"),
    ],
)
async def test_a_turn_cut_short_by_a_stopped_sandbox_says_so_and_is_not_cancelled(
    session, cookie, how, reason, message
):
    comm, _ = await open_socket(session.pk, cookie)
    ending = await stop_during_a_turn(comm, session, **how)
    await comm.disconnect()
    errors = [e["data"] for e in ending if e["kind"] == "agent_error"]
    assert [e.get("reason") for e in errors] == [reason]
    assert errors[0]["message"].startswith(message)
    assert ending[-1]["data"] == {"stop_reason": "interrupted"}
    assert [e for e in ending if e["kind"] == "turn_end"] == [ending[-1]]


async def test_the_next_prompt_carries_on_in_a_new_sandbox_with_the_log_kept(session, cookie):
    comm, _ = await open_socket(session.pk, cookie)
    await stop_during_a_turn(comm, session, by_staff=True)
    before = await db_sync_to_async(lambda: list(Event.objects.filter(session=session)))()

    await comm.send_json_to({"type": "prompt", "id": "p2", "text": "hello again"})
    frames = events_of(await receive_until(comm, is_turn_end, timeout=60))
    await comm.disconnect()
    kinds = [f["kind"] for f in frames]
    # It waits in the queue while the new sandbox is provisioned (or runs at once if that
    # was quicker), and runs once.
    assert kinds[0] in ("prompt_queued", "user_message")
    assert [f["data"]["id"] for f in frames if f["kind"] == "user_message"] == ["p2"]
    assert "agent_restarted" in kinds  # a new agent, as after any replacement
    assert frames[-1]["data"] == {"stop_reason": "end_turn"}
    said = "".join(
        f["data"]["content"]["text"] for f in frames if f["kind"] == "agent_message_chunk"
    )
    assert "hello" in said and "again" in said

    moved = await db_sync_to_async(Session.objects.select_related("sandbox").get)(pk=session.pk)
    assert moved.sandbox_id != session.sandbox_id
    assert moved.sandbox.status == Sandbox.Status.RUNNING
    after = await db_sync_to_async(lambda: list(Event.objects.filter(session=session)))()
    assert after[: len(before)] == before  # the conversation stays
