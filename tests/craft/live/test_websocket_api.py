"""The session websocket (API v1) end to end in-process: consumer, runner, real demo agent."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from pathlib import Path

import pytest

from craft import services
from craft.models import Event
from craft.storage.db import db_sync_to_async
from craft.storage.eventlog import append_events
from craft.turns.registry import runners
from craft.turns.turn import Turn
from sandboxes.agent.connection import AgentConnection
from sandboxes.agent.protocol import Update
from tests.ready import open_ready_session

from ..logs import stored_log
from ..wsclient import (
    CONNECT_TIMEOUT,
    communicator,
    events_of,
    is_turn_end,
    open_socket,
    receive_until,
    session_cookie,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

# Small ACP agents that misbehave in ways the demo agent does not.
AGENTS = Path(__file__).parent.parent.parent / "agents"


@pytest.fixture
def session(owner):
    return open_ready_session(owner, "websocket")


def store_events(session, count, start=0):
    append_events(session.pk, [("agent_message_chunk", _chunk(start + i)) for i in range(count)])


def _chunk(i):
    return {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": f"{i} "}}


async def next_error(comm):
    return (await receive_until(comm, lambda f: f["type"] == "error"))[-1]


async def stored(session, kind=None):
    @db_sync_to_async
    def query():
        events = Event.objects.filter(session=session).order_by("seq")
        return list(events.filter(kind=kind) if kind else events)

    return await query()


async def test_hello_reports_the_session_state(session, cookie):
    await db_sync_to_async(store_events)(session, 3)
    comm, hello = await open_socket(session.pk, cookie)
    assert hello == {
        "type": "hello",
        "session": str(session.pk),
        "last_seq": 3,
        "running": False,
        "sandbox": {
            "id": str(session.sandbox_id),
            "status": "running",
            "detail": "ready",
            "error": "",
        },
    }
    assert await comm.receive_nothing(0.2)  # no events before resume
    await comm.disconnect()


async def test_resume_after_n_returns_exactly_the_later_events_in_order(session, cookie):
    await db_sync_to_async(store_events)(session, 10)
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 4})
    frames = await receive_until(comm, lambda f: f.get("seq") == 10)
    assert [f["seq"] for f in frames] == [5, 6, 7, 8, 9, 10]
    assert frames[0] == {
        "type": "event",
        "seq": 5,
        "kind": "agent_message_chunk",
        "data": _chunk(4),
    }
    assert await comm.receive_nothing(0.3)
    await comm.disconnect()


async def test_events_committed_during_a_replay_arrive_exactly_once(session, cookie):
    await db_sync_to_async(store_events)(session, 1000)
    comm, _ = await open_socket(session.pk, cookie)

    async def write_more():
        for batch in range(10):
            store = db_sync_to_async(store_events)
            await store(session, 5, 1000 + batch * 5)
            await asyncio.sleep(0)

    writer = asyncio.create_task(write_more())
    await comm.send_json_to({"type": "resume", "after": 0})
    frames = await receive_until(comm, lambda f: f.get("seq") == 1050, timeout=30)
    await writer
    assert [f["seq"] for f in frames] == list(range(1, 1051))
    assert [f["data"]["content"]["text"] for f in frames[1000:1003]] == ["1000 ", "1001 ", "1002 "]
    assert await comm.receive_nothing(0.3)
    await comm.disconnect()


async def test_a_prompt_streams_the_turn_and_stores_it(session, cookie):
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    await comm.send_json_to({"type": "prompt", "id": "p-1", "text": "hello agent"})
    frames = await receive_until(comm, is_turn_end)
    kinds = [f["kind"] for f in frames]
    assert kinds[0] == "user_message"
    assert frames[0]["data"] == {"id": "p-1", "text": "hello agent"}
    assert kinds[-1] == "turn_end"
    assert frames[-1]["data"] == {"stop_reason": "end_turn"}
    chunks = [f["data"]["content"]["text"] for f in frames if f["kind"] == "agent_message_chunk"]
    assert "".join(chunks) == "Echo: hello agent"
    assert [f["seq"] for f in frames] == [e.seq for e in await stored(session)]
    await comm.disconnect()


async def test_a_repeated_prompt_id_gives_one_turn(session, cookie):
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    await comm.send_json_to({"type": "prompt", "id": "same", "text": "once"})
    await comm.send_json_to({"type": "prompt", "id": "same", "text": "once"})
    await receive_until(comm, is_turn_end)
    await comm.send_json_to({"type": "prompt", "id": "same", "text": "once"})
    assert await comm.receive_nothing(0.5)
    assert len(await stored(session, "user_message")) == 1
    assert len(await stored(session, "turn_end")) == 1
    await comm.disconnect()


async def test_a_prompt_that_may_not_queue_is_refused_during_a_turn(session, cookie):
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    await comm.send_json_to({"type": "prompt", "id": "a", "text": "slow 30 0.05"})
    await receive_until(comm, lambda f: f.get("kind") == "agent_message_chunk")
    await comm.send_json_to({"type": "prompt", "id": "b", "text": "second", "queue": False})
    frames = await receive_until(comm, lambda f: f["type"] == "error")
    assert frames[-1]["code"] == "turn_running"
    await comm.send_json_to({"type": "cancel"})
    await receive_until(comm, is_turn_end)
    assert [e.data["id"] for e in await stored(session, "user_message")] == ["a"]
    await comm.disconnect()


async def test_cancel_during_the_slow_stream_ends_the_turn_cancelled(session, cookie):
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    await comm.send_json_to({"type": "prompt", "id": "slow", "text": "slow 200 0.05"})
    await receive_until(comm, lambda f: f.get("kind") == "agent_message_chunk")
    await comm.send_json_to({"type": "cancel"})
    frames = await receive_until(comm, is_turn_end, timeout=5)
    assert frames[-1]["data"] == {"stop_reason": "cancelled"}
    chunks = await stored(session, "agent_message_chunk")
    assert 0 < len(chunks) < 200
    await comm.disconnect()


@pytest.mark.parametrize(("option", "written"), [("allow", True), ("reject", False)])
async def test_a_permission_answer_reaches_the_agent(session, cookie, option, written):
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    await comm.send_json_to({"type": "prompt", "id": "w", "text": "write out.txt from the test"})
    frames = await receive_until(comm, lambda f: f.get("kind") == "permission_request")
    request = frames[-1]["data"]
    assert [o["optionId"] for o in request["options"]] == ["allow", "reject"]
    await comm.send_json_to({"type": "permission", "request": request["request"], "option": option})
    frames = await receive_until(comm, is_turn_end)
    answer = next(f for f in frames if f["kind"] == "permission_answer")
    assert answer["data"] == {"request": request["request"], "option": option}
    workspace = Path(session.sandbox.reference) / "sessions" / str(session.pk)
    assert (workspace / "out.txt").exists() is written
    final_status = [f["data"].get("status") for f in frames if f["kind"] == "tool_call_update"]
    assert final_status[-1] == ("completed" if written else "failed")
    await comm.disconnect()


async def test_a_bad_permission_answer_is_refused_and_loses_nothing(session, cookie):
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    await comm.send_json_to({"type": "prompt", "id": "w", "text": "write x.txt y"})
    frames = await receive_until(comm, lambda f: f.get("kind") == "permission_request")
    request = frames[-1]["data"]["request"]
    await comm.send_json_to({"type": "permission", "request": request, "option": "maybe"})
    assert (await next_error(comm))["code"] == "invalid_option"
    await comm.send_json_to({"type": "permission", "request": "nope", "option": "allow"})
    assert (await next_error(comm))["code"] == "unknown_request"
    # The real request is still open and can be answered.
    await comm.send_json_to({"type": "permission", "request": request, "option": "allow"})
    frames = await receive_until(comm, is_turn_end)
    assert frames[-1]["data"]["stop_reason"] == "end_turn"
    await comm.disconnect()


async def test_two_connections_on_one_session_both_see_every_event(session, cookie):
    first, _ = await open_socket(session.pk, cookie)
    second, _ = await open_socket(session.pk, cookie)
    for comm in (first, second):
        await comm.send_json_to({"type": "resume", "after": 0})
    await first.send_json_to({"type": "prompt", "id": "both", "text": "count 50"})
    seen_first = events_of(await receive_until(first, is_turn_end))
    seen_second = events_of(await receive_until(second, is_turn_end))
    expected = [e.seq for e in await stored(session)]
    assert [f["seq"] for f in seen_first] == expected
    assert [f["seq"] for f in seen_second] == expected
    for comm in (first, second):
        await comm.disconnect()


async def test_a_turn_goes_on_when_the_browser_leaves(session, cookie):
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "prompt", "id": "bye", "text": "slow 10 0.05"})
    await asyncio.sleep(0.1)
    await comm.disconnect()
    for _ in range(100):
        if await stored(session, "turn_end"):
            break
        await asyncio.sleep(0.05)
    (end,) = await stored(session, "turn_end")
    assert end.data == {"stop_reason": "end_turn"}
    assert len(await stored(session, "agent_message_chunk")) == 10
    # Coming back shows the whole turn.
    comm, hello = await open_socket(session.pk, cookie)
    assert hello["running"] is False
    await comm.send_json_to({"type": "resume", "after": 0})
    frames = await receive_until(comm, is_turn_end)
    assert len(frames) == hello["last_seq"]
    await comm.disconnect()


async def test_an_agent_crash_ends_the_turn_with_an_error_and_the_next_prompt_works(
    session, cookie
):
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    await comm.send_json_to({"type": "prompt", "id": "c", "text": "crash"})
    frames = await receive_until(comm, is_turn_end)
    assert frames[-2]["kind"] == "agent_error"
    assert "exited with code 3" in frames[-2]["data"]["message"]
    assert frames[-1]["data"] == {"stop_reason": "error"}
    await comm.send_json_to({"type": "prompt", "id": "d", "text": "again"})
    frames = await receive_until(comm, is_turn_end)
    assert frames[-1]["data"] == {"stop_reason": "end_turn"}
    await comm.disconnect()


async def test_bad_frames_get_errors_and_the_socket_stays_open(session, cookie):
    comm, _ = await open_socket(session.pk, cookie)
    cases = [
        ("not json", "bad_json"),
        ("[1, 2]", "bad_frame"),
        ('{"type": "dance"}', "unknown_type"),
        ('{"type": "prompt", "text": "no id"}', "bad_frame"),
        ('{"type": "prompt", "id": "e", "text": "   "}', "empty_prompt"),
        ('{"type": "resume", "after": -1}', "bad_frame"),
        ('{"type": "cancel"}', "not_running"),
    ]
    for text, code in cases:
        await comm.send_to(text_data=text)
        frame = await comm.receive_json_from(timeout=5)
        assert frame["type"] == "error" and frame["code"] == code, (text, frame)
    assert await stored(session) == []
    await comm.disconnect()


async def test_a_stranger_is_refused_with_4403(session, stranger):
    comm = communicator(session.pk, await db_sync_to_async(session_cookie)(stranger))
    connected, _ = await comm.connect(timeout=CONNECT_TIMEOUT)
    assert connected
    assert await comm.receive_output(timeout=5) == {"type": "websocket.close", "code": 4403}


async def test_an_anonymous_user_is_refused_with_4401(session):
    comm = communicator(session.pk, None)
    connected, _ = await comm.connect(timeout=CONNECT_TIMEOUT)
    assert connected
    assert await comm.receive_output(timeout=5) == {"type": "websocket.close", "code": 4401}


async def test_an_unknown_session_is_refused_with_4403(owner, cookie):
    comm = communicator("00000000-0000-4000-8000-000000000000", cookie)
    await comm.connect(timeout=CONNECT_TIMEOUT)
    assert (await comm.receive_output(timeout=5))["code"] == 4403


@pytest.mark.parametrize("origin", ["http://evil.example", None])
async def test_a_foreign_or_missing_origin_is_refused(session, cookie, origin):
    comm = communicator(session.pk, cookie, origin=origin)
    connected, _ = await comm.connect(timeout=CONNECT_TIMEOUT)
    assert not connected


@pytest.fixture
def sending_threads(monkeypatch):
    """The names of the threads that send prompts, permission answers and cancels to agents."""
    names: list[str] = []
    for method in ("prompt", "answer_permission", "cancel"):
        original = getattr(AgentConnection, method)

        def noted(self, *args, original=original, **kwargs):
            names.append(threading.current_thread().name)
            return original(self, *args, **kwargs)

        monkeypatch.setattr(AgentConnection, method, noted)
    return names


async def test_a_local_agent_is_sent_its_prompts_and_answers_from_the_event_loop(
    session, cookie, sending_threads
):
    """A local agent's pipe never makes a write wait (what it cannot take waits in memory),
    so a prompt, an answer and a cancel go from the event loop, not through a thread."""
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    await comm.send_json_to({"type": "prompt", "id": "l1", "text": "write a.txt x"})
    frames = await receive_until(comm, lambda f: f.get("kind") == "permission_request")
    request = frames[-1]["data"]["request"]
    await comm.send_json_to({"type": "permission", "request": request, "option": "allow"})
    await receive_until(comm, is_turn_end)
    await comm.send_json_to({"type": "prompt", "id": "l2", "text": "slow 50 0.1"})
    await receive_until(comm, lambda f: f.get("kind") == "agent_message_chunk")
    await comm.send_json_to({"type": "cancel"})
    frames = await receive_until(comm, is_turn_end)
    assert frames[-1]["data"] == {"stop_reason": "cancelled"}
    assert sending_threads == [threading.current_thread().name] * 4
    await comm.disconnect()


async def test_the_live_chat_works_unchanged_on_the_kubernetes_backend(
    kube_backend, kube, owner, sending_threads
):
    from sandboxes.backends.kubernetes import pod_name

    session = await db_sync_to_async(open_ready_session)(owner, "on a pod")
    comm, hello = await open_socket(session.pk, await db_sync_to_async(session_cookie)(owner))
    assert hello["sandbox"]["status"] == "running"
    await comm.send_json_to({"type": "resume", "after": 0})
    await comm.send_json_to({"type": "prompt", "id": "k1", "text": "write pod.txt from a pod"})
    frames = await receive_until(comm, lambda f: f.get("kind") == "permission_request")
    request = frames[-1]["data"]["request"]
    await comm.send_json_to({"type": "permission", "request": request, "option": "allow"})
    frames = await receive_until(comm, is_turn_end)
    assert frames[-1]["data"] == {"stop_reason": "end_turn"}
    folder = kube.workspace("craft-test", pod_name(session.sandbox)) / "sessions" / str(session.pk)
    assert (folder / "pod.txt").read_text() == "from a pod"

    await comm.send_json_to({"type": "prompt", "id": "k2", "text": "pid"})
    frames = await receive_until(comm, is_turn_end)
    (reply,) = [f for f in frames if f["kind"] == "agent_message_chunk"]
    agents = [e for e in kube.execs if "sandboxes.in_sandbox.demo_agent" in e.argv]
    assert reply["data"]["content"]["text"].split()[:2] == ["pid", str(agents[0].pid)]
    assert len(agents) == 1  # one exec served both prompts
    # A pod exec's websocket may make a write wait: never on the event loop.
    assert len(sending_threads) == 3
    assert all(name.startswith("craft-agent-call") for name in sending_threads), sending_threads
    await comm.disconnect()


async def test_cancel_ends_the_turn_even_when_the_agent_ignores_it(session, cookie, settings):
    settings.CRAFT_AGENT_COMMAND = [sys.executable, str(AGENTS / "stubborn_agent.py")]
    settings.CRAFT_CANCEL_GRACE_SECONDS = 0.5
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    await comm.send_json_to({"type": "prompt", "id": "s1", "text": "go"})
    first = await receive_until(comm, lambda f: f.get("kind") == "agent_message_chunk")
    await comm.send_json_to({"type": "cancel"})
    frames = await receive_until(comm, is_turn_end, timeout=5)
    assert frames[-1]["data"] == {"stop_reason": "cancelled"}
    # The stopped agent is replaced by a new process on the next prompt. (Chunks the old
    # one wrote before it was killed are never stored after the turn's end.)
    old_pid = first[-1]["data"]["content"]["text"].split()[1]

    def new_agent_chunk(frame):
        text = frame.get("data", {}).get("content", {}).get("text", "")
        return frame.get("kind") == "agent_message_chunk" and text.split()[1] != old_pid

    await comm.send_json_to({"type": "prompt", "id": "s2", "text": "again"})
    await receive_until(comm, new_agent_chunk)
    await comm.send_json_to({"type": "cancel"})
    await receive_until(comm, is_turn_end, timeout=5)
    kinds = [kind for _, kind, _ in await stored_log(session)]
    first_end = kinds.index("turn_end")
    assert kinds[first_end + 1] == "user_message", kinds  # nothing of the turn after its end
    await comm.disconnect()


def is_usage(frame: dict) -> bool:
    return frame.get("kind") == "usage_update"


def texts_of(frames: list[dict]) -> list[str]:
    return [f["data"].get("content", {}).get("text") or f["kind"] for f in frames]


async def test_updates_of_the_session_after_the_prompt_response_are_stored_after_its_end(
    session, cookie, settings
):
    settings.CRAFT_AGENT_COMMAND = [sys.executable, str(AGENTS / "late_agent.py")]
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    await comm.send_json_to({"type": "prompt", "id": "l1", "text": "go"})
    frames = await receive_until(comm, is_usage)
    # The chunks, tool call and plan sent after the answer were of the turn: not stored.
    assert texts_of(frames) == ["user_message", "agent_info", "on time", "turn_end", "usage_update"]
    assert [f["seq"] for f in frames] == [1, 2, 3, 4, 5]
    await comm.disconnect()


async def test_a_cancelled_turn_whose_agent_writes_after_answering_stores_nothing_after_its_end(
    session, cookie, settings
):
    settings.CRAFT_AGENT_COMMAND = [sys.executable, str(AGENTS / "late_agent.py")]
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    await comm.send_json_to({"type": "prompt", "id": "w1", "text": "wait"})
    await receive_until(comm, lambda f: f.get("kind") == "agent_message_chunk")
    await comm.send_json_to({"type": "cancel"})
    await receive_until(comm, is_usage)  # the agent's last word after its answer
    await comm.send_json_to({"type": "prompt", "id": "w2", "text": "again"})
    await receive_until(comm, is_usage)
    log = await stored_log(session)
    assert [(seq, kind, data.get("content", {}).get("text")) for seq, kind, data in log] == [
        (1, "user_message", None),
        (2, "agent_info", None),
        (3, "agent_message_chunk", "on time"),
        (4, "turn_end", None),
        (5, "usage_update", None),
        (6, "user_message", None),
        (7, "agent_message_chunk", "on time"),
        (8, "turn_end", None),
        (9, "usage_update", None),
    ]
    assert [data for _, kind, data in log if kind == "turn_end"] == [
        {"stop_reason": "cancelled"},
        {"stop_reason": "end_turn"},
    ]
    # Counted where they were dropped: two chunks, a tool call and a plan after each answer.
    assert runners.get(session.pk).connection.late_updates_dropped == 8
    await comm.disconnect()


async def test_updates_of_an_ended_turn_handed_over_after_its_end_are_dropped_and_counted(
    session, cookie, settings
):
    """What a stopped agent wrote before it died can reach the runner after the turn's end
    that stopping it made: the reader hands over what it read (here, as it would)."""
    settings.CRAFT_AGENT_COMMAND = [sys.executable, str(AGENTS / "late_agent.py")]
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    await comm.send_json_to({"type": "prompt", "id": "h1", "text": "go"})
    await receive_until(comm, is_usage)
    runner = runners.get(session.pk)
    read = [
        Update("agent_message_chunk", {"sessionUpdate": "agent_message_chunk", **_chunk(9)}),
        Update("usage_update", {"sessionUpdate": "usage_update", "used": 20, "size": 1000}),
    ]
    reader = threading.Thread(target=lambda: [runner.inbox.put(item) for item in read])
    reader.start()
    reader.join()
    frames = await receive_until(comm, is_usage)
    assert [f["kind"] for f in frames] == ["usage_update"]
    assert frames[0]["data"]["used"] == 20
    assert runner.late_updates_dropped == 1
    assert [kind for _, kind, _ in await stored_log(session)][-3:] == [
        "turn_end", "usage_update", "usage_update",
    ]  # fmt: skip
    await comm.disconnect()


async def test_updates_after_the_prompt_response_wait_for_the_turns_end_to_be_stored(
    session, cookie, settings, monkeypatch
):
    """The race behind a flaky run: the late updates' drain ran while the turn's end was still
    on its way to the log, and stored them first. Here the end is held back on purpose."""
    settings.CRAFT_AGENT_COMMAND = [sys.executable, str(AGENTS / "late_agent.py")]
    end = Turn.end

    async def slow_end(self, *args, **kwargs):
        await asyncio.sleep(0.5)  # the late updates are in the inbox long before
        await end(self, *args, **kwargs)

    monkeypatch.setattr(Turn, "end", slow_end)
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    await comm.send_json_to({"type": "prompt", "id": "l1", "text": "go"})
    frames = await receive_until(comm, is_usage)
    assert texts_of(frames) == ["user_message", "agent_info", "on time", "turn_end", "usage_update"]
    await comm.disconnect()


async def test_an_answer_read_before_its_prompt_call_returns_still_comes_first(
    session, cookie, settings, monkeypatch
):
    """The race behind a loaded run: the agent answered the prompt and went on writing while
    the thread that wrote the prompt had not yet asked to hear of the answer; the answer was
    then handed on after the updates that followed it. Here that thread is held back."""
    settings.CRAFT_AGENT_COMMAND = [sys.executable, str(AGENTS / "late_agent.py")]
    write = AgentConnection._write

    def slow_write(self, message):
        write(self, message)
        if message.get("method") == "session/prompt":
            time.sleep(0.5)  # the reader reads the answer and both late updates meanwhile

    monkeypatch.setattr(AgentConnection, "_write", slow_write)
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    await comm.send_json_to({"type": "prompt", "id": "l1", "text": "go"})
    frames = await receive_until(comm, is_usage)
    assert texts_of(frames) == ["user_message", "agent_info", "on time", "turn_end", "usage_update"]
    await comm.disconnect()


async def test_deleting_the_session_closes_its_open_sockets_with_4404(session, cookie):
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    await db_sync_to_async(services.delete_session)(session)
    error = await next_error(comm)
    assert error["code"] == "session_deleted"
    assert (await comm.receive_output(timeout=5))["code"] == 4404


async def test_a_prompt_on_a_deleted_session_is_answered_and_the_socket_closed(session, cookie):
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    # Deleted behind the socket's back: no notice reaches it.
    await db_sync_to_async(lambda: type(session).objects.filter(pk=session.pk).delete())()
    await comm.send_json_to({"type": "prompt", "id": "late", "text": "anyone there?"})
    error = await next_error(comm)
    assert error["code"] == "session_deleted"
    assert (await comm.receive_output(timeout=5))["code"] == 4404


async def test_start_agent_brings_what_the_agent_offers_before_the_first_prompt(session, cookie):
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    await comm.send_json_to({"type": "start_agent"})
    frames = await receive_until(comm, lambda f: f.get("kind") == "available_commands_update")
    kinds = [f["kind"] for f in events_of(frames)]
    assert kinds[0] == "agent_info" and "user_message" not in kinds
    assert events_of(frames)[0]["data"]["configOptions"]  # the pickers can be drawn now
    await comm.send_json_to({"type": "start_agent"})  # it runs: nothing more happens
    assert await comm.receive_nothing(0.5)
    # The first prompt is served by that agent: no second start, no agent_restarted.
    await comm.send_json_to({"type": "prompt", "id": "p1", "text": "hello"})
    frames = events_of(await receive_until(comm, is_turn_end))
    assert [f["kind"] for f in frames if f["kind"] in ("agent_info", "agent_restarted")] == []
    assert len(await stored(session, "agent_info")) == 1
    await comm.disconnect()
