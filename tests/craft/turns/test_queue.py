"""Queued prompts (docs/websocket-api.md, "Queued prompts"): in-process, real demo agent.

A prompt sent while a turn runs waits in the session's queue and runs, in order, when the
turn ends; until it starts it can be edited, removed, or sent now (steer). Across a server
kill and a worker failover: tests/craft/turns/test_restarts.py and tests/test_cluster.py.
"""

from __future__ import annotations

import pytest

from craft.models import Event, QueuedPrompt
from craft.storage.db import db_sync_to_async
from craft.turns.queue import MAX_QUEUED
from tests.ready import open_ready_session

from ..wsclient import is_turn_end, open_socket, receive_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture
def session(owner):
    return open_ready_session(owner, "queue")


@db_sync_to_async
def log_of(session):
    return [(e.kind, e.data) for e in Event.objects.filter(session=session).order_by("seq")]


def prompts_run(log):
    return [data["text"] for kind, data in log if kind == "user_message"]


def turn_ends(log):
    return [data["stop_reason"] for kind, data in log if kind == "turn_end"]


async def until_kind(comm, kind, count=1):
    seen = []

    def enough(frame):
        if frame.get("kind") == kind:
            seen.append(frame)
        return len(seen) >= count

    return await receive_until(comm, enough, timeout=60)


async def started_slow_turn(session, cookie, text="slow 400 0.05"):
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    await comm.send_json_to({"type": "prompt", "id": "first", "text": text})
    await until_kind(comm, "agent_message_chunk")
    return comm


async def test_prompts_during_a_turn_run_in_order_after_it_edited_and_removed(session, cookie):
    comm = await started_slow_turn(session, cookie, "slow 60 0.05")
    for n in (1, 2, 3):
        await comm.send_json_to({"type": "prompt", "id": f"q{n}", "text": f"queued {n}"})
    await until_kind(comm, "prompt_queued", 3)
    await comm.send_json_to({"type": "edit_queued", "id": "q1", "text": "edited one"})
    await comm.send_json_to({"type": "remove_queued", "id": "q2"})
    await until_kind(comm, "queued_prompt_removed")
    await until_kind(comm, "turn_end", 3)  # the first turn, then q1's and q3's
    log = await log_of(session)
    assert prompts_run(log) == ["slow 60 0.05", "edited one", "queued 3"]
    assert turn_ends(log) == ["end_turn"] * 3
    kinds = [kind for kind, _ in log]
    assert kinds.index("queued_prompt_edited") < kinds.index("queued_prompt_removed")
    # Each queued prompt starts only after the turn before it ended.
    ends = [i for i, kind in enumerate(kinds) if kind == "turn_end"]
    starts = [i for i, kind in enumerate(kinds) if kind == "user_message"]
    assert starts[1] > ends[0] and starts[2] > ends[1]
    assert not await db_sync_to_async(QueuedPrompt.objects.filter(session=session).exists)()
    await comm.disconnect()


async def test_a_queued_prompt_that_started_can_no_longer_be_changed(session, cookie):
    comm = await started_slow_turn(session, cookie, "slow 20 0.05")
    await comm.send_json_to({"type": "prompt", "id": "q", "text": "queued"})
    await until_kind(comm, "turn_end", 2)
    for frame in (
        {"type": "edit_queued", "id": "q", "text": "too late"},
        {"type": "remove_queued", "id": "q"},
        {"type": "send_now", "id": "q"},
        {"type": "remove_queued", "id": "never-sent"},
    ):
        await comm.send_json_to(frame)
        error = (await receive_until(comm, lambda f: f["type"] == "error"))[-1]
        assert error["code"] == "not_queued", error
    assert prompts_run(await log_of(session)) == ["slow 20 0.05", "queued"]
    await comm.disconnect()


async def test_send_now_cancels_the_turn_and_runs_that_prompt_next(session, cookie):
    comm = await started_slow_turn(session, cookie)
    await comm.send_json_to({"type": "prompt", "id": "a", "text": "waits"})
    await comm.send_json_to({"type": "prompt", "id": "b", "text": "steers"})
    await until_kind(comm, "prompt_queued", 2)
    await comm.send_json_to({"type": "send_now", "id": "b"})
    await until_kind(comm, "turn_end", 3)
    log = await log_of(session)
    assert prompts_run(log) == ["slow 400 0.05", "steers", "waits"]
    assert turn_ends(log) == ["cancelled", "end_turn", "end_turn"]
    assert ("prompt_steered", {"id": "b"}) in log
    await comm.disconnect()


async def test_a_resent_queued_prompt_is_queued_once(session, cookie):
    comm = await started_slow_turn(session, cookie, "slow 30 0.05")
    for _ in range(3):
        await comm.send_json_to({"type": "prompt", "id": "again", "text": "once"})
    await until_kind(comm, "turn_end", 2)
    await comm.send_json_to({"type": "prompt", "id": "again", "text": "once"})
    assert await comm.receive_nothing(0.5)
    log = await log_of(session)
    assert prompts_run(log) == ["slow 30 0.05", "once"]
    assert [kind for kind, _ in log].count("prompt_queued") == 1
    await comm.disconnect()


async def test_a_full_queue_refuses_more_and_keeps_what_it_has(session, cookie):
    comm = await started_slow_turn(session, cookie)
    for n in range(MAX_QUEUED):
        await comm.send_json_to({"type": "prompt", "id": f"q{n}", "text": f"n {n}"})
    await until_kind(comm, "prompt_queued", MAX_QUEUED)
    await comm.send_json_to({"type": "prompt", "id": "over", "text": "one too many"})
    error = (await receive_until(comm, lambda f: f["type"] == "error"))[-1]
    assert error["code"] == "queue_full"
    count = db_sync_to_async(QueuedPrompt.objects.filter(session=session).count)
    assert await count() == MAX_QUEUED
    for n in range(MAX_QUEUED):  # nothing may run after the test
        await comm.send_json_to({"type": "remove_queued", "id": f"q{n}"})
    await until_kind(comm, "queued_prompt_removed", MAX_QUEUED)
    await comm.send_json_to({"type": "cancel"})
    await receive_until(comm, is_turn_end)
    assert await count() == 0
    await comm.disconnect()


async def test_queue_frames_with_a_bad_shape_are_refused(session, cookie):
    comm, _ = await open_socket(session.pk, cookie)
    for frame, code in (
        ({"type": "edit_queued", "id": "x"}, "bad_frame"),
        ({"type": "edit_queued", "id": "x", "text": "   "}, "empty_prompt"),
        ({"type": "remove_queued"}, "bad_frame"),
        ({"type": "send_now", "id": 3}, "bad_frame"),
        ({"type": "prompt", "id": "p", "text": "hi", "queue": "yes"}, "bad_frame"),
    ):
        await comm.send_json_to(frame)
        error = (await receive_until(comm, lambda f: f["type"] == "error"))[-1]
        assert error["code"] == code, (frame, error)
    assert await log_of(session) == []
    await comm.disconnect()
