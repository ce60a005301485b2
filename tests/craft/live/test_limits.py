"""Limits with clear errors, and memory that stays bounded whatever an agent sends."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import websocket

from craft.models import Event, Session
from craft.storage.db import db_sync_to_async
from sandboxes.in_sandbox.demo_agent import big_text
from tests.ready import open_ready_session

from ...server import Daphne, Socket, close_code, closed_by_server, wait_for_log
from ..api.test_http_api import api, send  # noqa: F401 (a fixture)
from ..wsclient import (
    CONNECT_TIMEOUT,
    communicator,
    is_turn_end,
    open_socket,
    receive_until,
    session_cookie,
)

pytestmark = pytest.mark.django_db(transaction=True)

MIB = 1024 * 1024


def vm_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field}")


def test_a_person_has_at_most_the_configured_number_of_sessions(api, owner, settings):  # noqa: F811
    settings.CRAFT_MAX_SESSIONS_PER_USER = 2
    assert [send(api, "post", "/api/sessions/", {}).status_code for _ in range(2)] == [201, 201]
    refused = send(api, "post", "/api/sessions/", {})
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "too_many_sessions"
    assert Session.objects.filter(owner=owner).count() == 2


@pytest.mark.asyncio
async def test_sockets_past_a_person_s_limit_are_closed_and_the_others_go_on(
    owner, stranger, settings
):
    settings.CRAFT_MAX_SOCKETS_PER_USER = 3
    session = await db_sync_to_async(open_ready_session)(owner, "tabs")
    cookie = await db_sync_to_async(session_cookie)(owner)
    sockets = [(await open_socket(session.pk, cookie))[0] for _ in range(3)]
    for _ in range(2):
        extra = communicator(session.pk, cookie)
        assert (await extra.connect(timeout=CONNECT_TIMEOUT))[0]
        assert await extra.receive_output(timeout=5) == {"type": "websocket.close", "code": 4429}
    # The first three go on.
    for index, comm in enumerate(sockets):
        await comm.send_json_to({"type": "resume", "after": 0})
        await comm.send_json_to({"type": "prompt", "id": f"p{index}", "text": "still here"})
        frames = await receive_until(comm, is_turn_end)
        assert frames[-1]["data"] == {"stop_reason": "end_turn"}
    # Someone else has a limit of their own.
    theirs = await db_sync_to_async(open_ready_session)(stranger, "theirs")
    their_cookie = await db_sync_to_async(session_cookie)(stranger)
    their_socket, _ = await open_socket(theirs.pk, their_cookie)
    # A closed socket makes room for a new one.
    await sockets[0].disconnect()
    again, _ = await open_socket(session.pk, cookie)
    for comm in (*sockets[1:], their_socket, again):
        await comm.disconnect()


@pytest.mark.asyncio
async def test_a_message_over_the_limit_is_skipped_and_recorded_and_the_turn_goes_on(
    owner, settings
):
    settings.CRAFT_MAX_MESSAGE_BYTES = 1024 * 1024
    session = await db_sync_to_async(open_ready_session)(owner, "big")
    comm, _ = await open_socket(session.pk, await db_sync_to_async(session_cookie)(owner))
    await comm.send_json_to({"type": "resume", "after": 0})
    await comm.send_json_to({"type": "prompt", "id": "b1", "text": "big 3"})
    frames = await receive_until(comm, is_turn_end, timeout=30)
    (skipped,) = [f["data"] for f in frames if f.get("kind") == "message_too_large"]
    assert skipped["limit"] == 1024 * 1024 and skipped["bytes"] > 3 * 1024 * 1024
    assert frames[-1]["data"] == {"stop_reason": "end_turn"}
    # Under the limit, a long message arrives whole, split into frames that fit.
    await comm.send_json_to({"type": "prompt", "id": "b2", "text": "big 0.9"})
    frames = await receive_until(comm, is_turn_end, timeout=30)
    texts = [f["data"]["content"]["text"] for f in frames if f.get("kind") == "agent_message_chunk"]
    assert len(texts) > 1 and "".join(texts) == big_text(0.9)
    await comm.disconnect()


def flood(tmp_path, session, warm: str, prompt: str, **env: str) -> tuple[list[dict], int]:
    """Serve with `env` on daphne of its own; prompt `warm` in the session (its agent then
    started), then `prompt`. Return the frames of that last turn and how many bytes the
    server grew by meanwhile (its peak after, less its resident size before)."""
    server = Daphne(tmp_path, **env).start()
    try:
        sock = Socket(server, session.owner, session.pk)
        sock.send({"type": "resume", "after": 0})
        sock.send({"type": "prompt", "id": "warm", "text": warm})
        sock.until(lambda f: f.get("kind") == "turn_end")
        before = vm_kib(server.process.pid, "VmRSS")
        sock.send({"type": "prompt", "id": "flood", "text": prompt})
        frames = sock.until(lambda f: f.get("kind") == "turn_end")
        peak = vm_kib(server.process.pid, "VmHWM")
        sock.close()
    finally:
        server.signal(signal.SIGTERM)
        server.wait(30)
    return frames, (peak - before) * 1024


def test_a_100_mb_agent_message_does_not_grow_the_server_beyond_a_few_times_the_limit(
    tmp_path, owner
):
    session = open_ready_session(owner, "huge")
    limit = 16 * 1024 * 1024
    frames, grown = flood(tmp_path, session, "hello", "big 100", CRAFT_MAX_MESSAGE_BYTES=str(limit))
    kinds = [f["kind"] for f in frames if f.get("type") == "event"]
    assert [kind for kind in kinds if kind != "usage_update"][-2:] == [
        "message_too_large",
        "turn_end",
    ]
    assert grown < 4 * limit, f"the server grew by {grown / 2**20:.0f} MiB"
    stored = Event.objects.filter(session=session, kind="message_too_large").get()
    assert json.loads(json.dumps(stored.data))["bytes"] > 100 * 2**20


def test_a_50_mb_terminal_output_stream_is_cut_at_the_limit_and_grows_nothing(tmp_path, owner):
    session = open_ready_session(owner, "terminal flood")
    limit = 1024 * 1024
    env = {"CRAFT_MAX_TERMINAL_OUTPUT_BYTES": str(limit)}
    frames, grown = flood(tmp_path, session, "terminal 1 0", "terminal 0 0 50", **env)
    assert frames[-1]["data"] == {"stop_reason": "end_turn"}
    events = [f for f in frames if f.get("type") == "event"]
    (limited,) = [f["data"] for f in events if f["kind"] == "terminal_output_limited"]
    assert limited["limit"] == limit
    outputs = [
        f["data"]["_meta"]["terminal_output"]["data"]
        for f in events
        if "terminal_output" in f["data"].get("_meta", {})
    ]
    assert sum(len(o.encode()) for o in outputs) == limit  # the first MiB, cut to fit
    # The exit still arrives: only output past the limit is dropped.
    exits = [f["data"]["_meta"]["terminal_exit"] for f in events
             if "terminal_exit" in f["data"].get("_meta", {})]  # fmt: skip
    assert [e["exit_code"] for e in exits] == [0]
    stored = Event.objects.filter(session=session, seq__gt=frames[0]["seq"] - 1)
    assert stored.count() < 40, "a dropped chunk stores nothing"
    assert sum(len(json.dumps(e.data)) for e in stored) < limit * 11 // 10
    assert grown < 64 * 2**20, f"the server grew by {grown / 2**20:.0f} MiB"


def test_sockets_that_do_not_read_are_held_to_the_buffer_limit_then_closed(tmp_path, owner):
    from craft.storage.eventlog import append_events

    session = open_ready_session(owner, "slow readers")
    line = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "x" * 1000}}
    for _ in range(20):
        append_events(session.pk, [("agent_message_chunk", line)] * 1000)
    limit = 1024 * 1024  # without it, these five sockets grew daphne by 177 MiB
    server = Daphne(
        tmp_path, CRAFT_SOCKET_BUFFER_BYTES=str(limit), CRAFT_SOCKET_STALL_SECONDS="5"
    ).start()
    try:
        before = vm_kib(server.process.pid, "VmRSS")
        readers = [Socket(server, owner, session.pk) for _ in range(5)]
        for sock in readers:
            sock.send({"type": "resume", "after": 0})  # 20 MB each, and nobody reads
        wait_for_log(server, "a client stopped reading; closing", count=5)
        grown = (vm_kib(server.process.pid, "VmRSS") - before) * 1024
        closed = [closed_by_server(sock.ws) for sock in readers]
        # A client that reads resumes from where it was and gets every event.
        sock = Socket(server, owner, session.pk)
        sock.send({"type": "resume", "after": 0})
        seqs = [f["seq"] for f in sock.until(lambda f: f.get("seq") == 20_000)]
        sock.close()
    finally:
        server.signal(signal.SIGTERM)
        server.wait(30)
    assert grown < 64 * 2**20, f"daphne grew by {grown / 2**20:.0f} MiB for 5 slow readers"
    assert closed == [True] * 5
    assert seqs == list(range(1, 20_001))


def test_an_oversized_prompt_frame_gets_an_error_and_the_socket_stays(tmp_path, owner):
    session = open_ready_session(owner, "paste")
    server = Daphne(tmp_path).start()
    try:
        sock = Socket(server, owner, session.pk)
        sock.send({"type": "prompt", "id": "paste", "text": "a" * (2 * 1024 * 1024)})
        error = sock.frame()
        sock.send({"type": "resume", "after": 0})
        sock.send({"type": "cancel"})
        after = sock.frame()
        sock.close()
    finally:
        server.signal(signal.SIGTERM)
        server.wait(30)
    assert error["type"] == "error" and error["code"] == "prompt_too_long"
    assert after == {"type": "error", "code": "not_running", "message": "no turn is running"}
    assert not Event.objects.filter(session=session).exists()


def test_a_frame_over_the_server_s_limit_is_closed_with_1009_and_nothing_else_is(tmp_path, owner):
    session = open_ready_session(owner, "huge")
    server = Daphne(tmp_path).start()
    sockets = []
    try:
        sock, bystander = Socket(server, owner, session.pk), Socket(server, owner, session.pk)
        sockets += [sock, bystander]
        # The server judges a frame by the length in its header. Send that header and the first
        # 64 KiB of a 10 MiB frame, then read: were the client still pushing the other 10 MiB
        # when the server closes, the server's kernel would answer the unread bytes with a reset,
        # and the close frame could be lost on the way (that is the client's doing, not Craft's).
        text = json.dumps({"type": "prompt", "id": "huge", "text": "a" * (10 * MIB)})
        frame = websocket.ABNF.create_frame(text, websocket.ABNF.OPCODE_TEXT).format()
        sock.ws.sock.sendall(frame[: 64 * 1024])
        sock.ws.settimeout(30)
        assert close_code(sock.ws) == 1009  # "message too big"
        # Only that socket: another one, and new ones, go on.
        sockets.append(Socket(server, owner, session.pk))
        for each in sockets[1:]:
            each.send({"type": "cancel"})
            assert each.frame()["code"] == "not_running"
    finally:
        for each in sockets:
            each.ws.shutdown()
        server.terminate()
    assert not Event.objects.filter(session=session).exists()


@pytest.mark.asyncio
async def test_a_turn_past_its_byte_limit_is_stopped_and_says_what_was_not_stored(owner, settings):
    settings.CRAFT_MAX_TURN_BYTES = 200_000
    settings.CRAFT_CANCEL_GRACE_SECONDS = 0.5
    session = await db_sync_to_async(open_ready_session)(owner, "chatty")
    comm, _ = await open_socket(session.pk, await db_sync_to_async(session_cookie)(owner))
    await comm.send_json_to({"type": "resume", "after": 0})
    await comm.send_json_to({"type": "prompt", "id": "c1", "text": "count 100000"})
    frames = await receive_until(comm, is_turn_end, timeout=30)
    assert frames[-1]["data"] == {"stop_reason": "interrupted"}
    message = frames[-2]["data"]["message"]
    assert message.startswith("The agent's output passed 0.190735 MB in one turn")
    stored = await db_sync_to_async(
        lambda: Event.objects.filter(session=session, kind="agent_message_chunk").count()
    )()
    assert 100 < stored < 100_000
    await comm.send_json_to({"type": "prompt", "id": "c2", "text": "hello"})
    frames = await receive_until(comm, is_turn_end, timeout=30)
    assert frames[-1]["data"] == {"stop_reason": "end_turn"}
    await comm.disconnect()
