"""Turns end exactly once when Craft's side fails: storage errors, and cancels at any moment.

Real demo agents, the real consumer, runner and writer; the faults are injected from outside:
the writer's transactions fail for a while, or the agent's start or the prompt's write is held
until a cancel has arrived.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading

import pytest
from django.db import OperationalError

from craft.models import TurnRecord
from craft.storage.db import db_sync_to_async
from craft.storage.eventlog import EventWriter
from craft.turns.turn import STORAGE_FAILED
from sandboxes import services as sandbox_services
from sandboxes.agent.connection import AgentConnection
from tests.ready import open_ready_session

from ..logs import stored_log
from ..wsclient import is_turn_end, open_socket, receive_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture
def session(owner):
    return open_ready_session(owner, "failures")


@db_sync_to_async
def running_turns(session) -> int:
    return TurnRecord.objects.running().filter(session=session).count()


async def agent_pid(comm, prompt_id: str) -> str:
    await comm.send_json_to({"type": "prompt", "id": prompt_id, "text": "pid"})
    frames = await receive_until(comm, is_turn_end)
    assert frames[-1]["data"] == {"stop_reason": "end_turn"}
    (chunk,) = [f for f in frames if f.get("kind") == "agent_message_chunk"]
    return chunk["data"]["content"]["text"]


async def test_a_storage_failure_mid_turn_stops_the_agent_and_loses_nothing(
    session, cookie, monkeypatch
):
    failing = threading.Event()
    store = EventWriter._store

    def flaky_store(self, jobs):
        if failing.is_set():
            raise OperationalError("injected: the database is unreachable")
        return store(self, jobs)

    monkeypatch.setattr(EventWriter, "_store", flaky_store)
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    first_pid = await agent_pid(comm, "p0")
    await comm.send_json_to({"type": "prompt", "id": "p1", "text": "slow 60 0.02"})
    await receive_until(comm, lambda f: f.get("kind") == "agent_message_chunk")
    failing.set()
    await asyncio.sleep(0.6)  # batches fail; the agent is stopped; the end waits for storage
    assert await running_turns(session) == 1
    failing.clear()
    frames = await receive_until(comm, is_turn_end, timeout=15)
    assert frames[-2:] == [
        {"type": "event", "seq": frames[-2]["seq"], "kind": "agent_error",
         "data": {"message": STORAGE_FAILED}},
        {"type": "event", "seq": frames[-1]["seq"], "kind": "turn_end",
         "data": {"stop_reason": "interrupted"}},
    ]  # fmt: skip
    log = await stored_log(session)
    assert [seq for seq, _, _ in log] == list(range(1, len(log) + 1))
    chunks = [d["content"]["text"] for _, k, d in log if k == "agent_message_chunk"][1:]
    numbers = [int(text.split()[1]) for text in chunks]
    assert numbers == list(range(1, len(numbers) + 1)), "what the agent said is all there"
    assert 1 <= len(numbers) < 60
    assert await running_turns(session) == 0
    # The next prompt gets a new agent and a normal turn.
    assert await agent_pid(comm, "p2") != first_pid
    await comm.disconnect()


async def cancelled_turn(comm, prompt_id: str, text: str) -> list[dict]:
    frames = await receive_until(comm, is_turn_end, timeout=15)
    assert [f["data"] for f in frames if f.get("kind") == "turn_end"] == [
        {"stop_reason": "cancelled"}
    ]
    return frames


async def test_a_cancel_while_the_agent_starts_ends_the_turn_cancelled(
    session, cookie, monkeypatch
):
    release = threading.Event()
    start = sandbox_services.agent_connection

    def slow_start(sandbox, session_id, *args):
        release.wait(10)
        return start(sandbox, session_id, *args)

    monkeypatch.setattr(sandbox_services, "agent_connection", slow_start)
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    await comm.send_json_to({"type": "prompt", "id": "c1", "text": "slow 50 0.05"})
    await receive_until(comm, lambda f: f.get("kind") == "user_message")
    await comm.send_json_to({"type": "cancel"})
    await asyncio.sleep(0.1)
    release.set()
    await cancelled_turn(comm, "c1", "slow")
    monkeypatch.setattr(sandbox_services, "agent_connection", start)
    assert (await agent_pid(comm, "c2")).startswith("pid ")
    await comm.disconnect()


async def test_a_cancel_while_the_prompt_is_written_reaches_the_agent(session, cookie, monkeypatch):
    """The race of a cancel landing after the turn checked for one and before the agent has
    the prompt: the agent must still hear the cancel."""
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    await agent_pid(comm, "warm")  # the agent runs; the next prompt goes straight to it
    writing, release = threading.Event(), threading.Event()
    prompt = AgentConnection.prompt

    def held_prompt(self, text, sink, *args):
        writing.set()
        release.wait(10)
        return prompt(self, text, sink, *args)

    monkeypatch.setattr(AgentConnection, "prompt", held_prompt)
    await comm.send_json_to({"type": "prompt", "id": "c3", "text": "slow 50 0.05"})
    await asyncio.to_thread(writing.wait, 10)
    await comm.send_json_to({"type": "cancel"})
    await asyncio.sleep(0.2)
    release.set()
    frames = await cancelled_turn(comm, "c3", "slow")
    assert len([f for f in frames if f.get("kind") == "agent_message_chunk"]) < 50
    monkeypatch.setattr(AgentConnection, "prompt", prompt)
    assert (await agent_pid(comm, "c4")).startswith("pid ")
    await comm.disconnect()


async def test_a_cancel_while_a_permission_is_pending_answers_it_and_ends_the_turn(session, cookie):
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    await comm.send_json_to({"type": "prompt", "id": "c5", "text": "write a.txt one"})
    frames = await receive_until(comm, lambda f: f.get("kind") == "permission_request")
    request = frames[-1]["data"]["request"]
    await comm.send_json_to({"type": "cancel"})
    frames = await cancelled_turn(comm, "c5", "write")
    answers = [f["data"] for f in frames if f.get("kind") == "permission_answer"]
    assert answers == [{"request": request, "option": None, "outcome": "cancelled"}]
    assert await running_turns(session) == 0
    await comm.disconnect()


async def test_a_cancel_just_before_the_turn_ends_leaves_one_turn_end(session, cookie):
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    for i in range(5):
        await comm.send_json_to({"type": "prompt", "id": f"r{i}", "text": "count 3"})
        await comm.send_json_to({"type": "cancel"})
        frames = await receive_until(comm, is_turn_end)
        assert len([f for f in frames if f.get("kind") == "turn_end"]) == 1
    log = await stored_log(session)
    assert len([1 for _, kind, _ in log if kind == "turn_end"]) == 5
    assert await running_turns(session) == 0
    await comm.disconnect()


async def test_a_hung_agent_s_turn_ends_by_the_idle_timeout_and_the_next_prompt_works(
    session, cookie, settings
):
    settings.CRAFT_TURN_IDLE_SECONDS = 1
    settings.CRAFT_CANCEL_GRACE_SECONDS = 0.5
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    pid = int((await agent_pid(comm, "h0")).split()[1])
    await comm.send_json_to({"type": "prompt", "id": "h1", "text": "slow 100 0.05"})
    await receive_until(comm, lambda f: f.get("kind") == "agent_message_chunk")
    os.kill(pid, signal.SIGSTOP)  # the agent hangs mid-turn
    try:
        frames = await receive_until(comm, is_turn_end, timeout=20)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)  # (it is gone by now unless the test failed)
    assert frames[-2]["kind"] == "agent_error"
    assert frames[-2]["data"]["message"] == (
        "The agent sent nothing for 1 seconds, so Craft stopped it."
    )
    assert frames[-1]["data"] == {"stop_reason": "interrupted"}
    assert (await agent_pid(comm, "h2")).split()[1] != str(pid)
    await comm.disconnect()


async def test_waiting_for_a_permission_answer_is_not_silence(session, cookie, settings):
    settings.CRAFT_TURN_IDLE_SECONDS = 0.5
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    await comm.send_json_to({"type": "prompt", "id": "w1", "text": "write a.txt one"})
    frames = await receive_until(comm, lambda f: f.get("kind") == "permission_request")
    await asyncio.sleep(1.5)
    request = frames[-1]["data"]["request"]
    await comm.send_json_to({"type": "permission", "request": request, "option": "allow"})
    frames = await receive_until(comm, is_turn_end)
    assert frames[-1]["data"] == {"stop_reason": "end_turn"}
    await comm.disconnect()
