"""Bad input from a client or an agent costs that input, never the socket or the session."""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest

from craft.models import Event, TurnRecord
from craft.storage.db import db_sync_to_async
from tests.ready import open_ready_session

from ...agents import AGENTS
from ...sandboxes.agent.test_acp_connection import PROMPT_ANSWERS
from ..wsclient import is_turn_end, open_socket, receive_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture
def session(owner):
    return open_ready_session(owner, "robustness")


@pytest.fixture
def hostile(settings):
    settings.CRAFT_AGENT_COMMAND = [sys.executable, str(AGENTS / "hostile_agent.py")]


def chunk_texts(frames):
    return [
        f["data"]["content"]["text"]
        for f in frames
        if f.get("kind") == "agent_message_chunk" and isinstance(f["data"].get("content"), dict)
    ]


async def test_a_frame_nested_100000_deep_gets_an_error_and_the_socket_stays(session, cookie):
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_to(text_data="[" * 100_000 + "]" * 100_000)
    error = await comm.receive_json_from(timeout=5)
    assert error == {
        "type": "error",
        "code": "bad_json",
        "message": "the frame is nested too deeply",
    }
    await comm.send_json_to({"type": "resume", "after": 0})
    await comm.send_json_to({"type": "prompt", "id": "after", "text": "still here"})
    frames = await receive_until(comm, is_turn_end)
    assert "".join(chunk_texts(frames)) == "Echo: still here"
    await comm.disconnect()


async def test_a_permission_request_with_odd_option_ids_can_be_answered(session, cookie, hostile):
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    await comm.send_json_to({"type": "prompt", "id": "p", "text": "permission"})
    frames = await receive_until(comm, lambda f: f.get("kind") == "permission_request")
    request = frames[-1]["data"]
    assert [o["optionId"] for o in request["options"]] == ["1", '{"x": 1}', "ok"]
    await comm.send_json_to({"type": "permission", "request": request["request"], "option": "1"})
    frames = await receive_until(comm, is_turn_end)
    assert frames[-1]["data"] == {"stop_reason": "end_turn"}
    answer = next(t for t in chunk_texts(frames) if t.startswith("answer: "))
    # The agent heard back, with its own (numeric) option id.
    assert json.loads(answer.removeprefix("answer: ")) == {
        "outcome": {"optionId": 1, "outcome": "selected"}
    }
    # The answering socket is still open and serves the next turn.
    await comm.send_json_to({"type": "prompt", "id": "q", "text": "ping"})
    frames = await receive_until(comm, is_turn_end)
    assert chunk_texts(frames) == ["hostile: ping", "after ping"]
    await comm.disconnect()


async def test_session_updates_with_list_params_do_not_end_the_agent(session, cookie, hostile):
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    pids = []
    for prompt_id, text in (("a", "whoami"), ("b", "listparams"), ("c", "whoami")):
        await comm.send_json_to({"type": "prompt", "id": prompt_id, "text": text})
        frames = await receive_until(comm, is_turn_end)
        assert frames[-1]["data"] == {"stop_reason": "end_turn"}
        assert not [f for f in frames if f.get("kind") == "agent_error"]
        texts = chunk_texts(frames)
        assert texts[-1] == f"after {text}"
        if text == "whoami":
            pids.append(json.loads(texts[0])["pid"])
    assert pids[0] == pids[1]  # the same agent process lived through it
    await comm.disconnect()


# Malformed protocol messages (the ACP client), and poison text (what craft.storage.normalise
# cleans).
BAD_AGENT_SCENARIOS = [
    "listparams",
    "badresponse",
    "deep",
    "malformed",
    "permission-none",
    "permission-badparams",
    "surrogate",
    "nul",
    "hugekind",
]


@pytest.mark.parametrize("scenario", BAD_AGENT_SCENARIOS)
async def test_after_a_malformed_agent_message_the_turn_ends_whole_and_replays(
    session, cookie, hostile, scenario
):
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    await comm.send_json_to({"type": "prompt", "id": "bad", "text": scenario})
    live = await receive_until(comm, is_turn_end)
    assert live[-1]["data"] == {"stop_reason": "end_turn"}
    assert chunk_texts(live)[-1] == f"after {scenario}"  # nothing after the bad item is lost
    await comm.disconnect()
    # Another browser resumes from the start and sees exactly what the first one saw.
    comm, hello = await open_socket(session.pk, cookie)
    assert hello["last_seq"] == live[-1]["seq"]
    await comm.send_json_to({"type": "resume", "after": 0})
    assert await receive_until(comm, is_turn_end) == live
    await comm.disconnect()


# Malformed answers to the prompt, and an agent that dies mid-turn: the turn ends once, in
# error, saying why, and the session takes the next prompt.


@db_sync_to_async
def turn_marks(session) -> tuple[list[str], int]:
    """Return the kinds of the session's user_message and turn_end events, in order, and how
    many turns still run."""
    kinds = Event.objects.filter(session=session, kind__in=["user_message", "turn_end"])
    running = TurnRecord.objects.running().filter(session=session).count()
    return list(kinds.order_by("seq").values_list("kind", flat=True)), running


async def assert_next_prompt_works(comm, session):
    await comm.send_json_to({"type": "prompt", "id": "next", "text": "ping"})
    frames = await receive_until(comm, is_turn_end)
    assert chunk_texts(frames) == ["hostile: ping", "after ping"]
    assert frames[-1]["data"] == {"stop_reason": "end_turn"}
    assert await turn_marks(session) == (["user_message", "turn_end"] * 2, 0)


@pytest.mark.parametrize(("answer", "message"), PROMPT_ANSWERS.items())
async def test_a_malformed_prompt_answer_ends_the_turn_once_in_error_and_the_session_goes_on(
    session, cookie, hostile, answer, message
):
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    await comm.send_json_to({"type": "prompt", "id": "bad", "text": f"badanswer {answer}"})
    frames = await receive_until(comm, is_turn_end)
    assert chunk_texts(frames) == ["after badanswer"]
    assert [f["data"] for f in frames if f.get("kind") == "agent_error"] == [{"message": message}]
    assert frames[-1]["data"] == {"stop_reason": "error"}
    await assert_next_prompt_works(comm, session)
    await comm.disconnect()


async def test_an_agent_killed_mid_turn_after_malformed_answers_ends_the_turn_once(
    session, cookie, hostile
):
    comm, _ = await open_socket(session.pk, cookie)
    await comm.send_json_to({"type": "resume", "after": 0})
    await comm.send_json_to({"type": "prompt", "id": "stall", "text": "stall"})
    frames = await receive_until(comm, lambda f: f.get("kind") == "agent_message_chunk")
    os.kill(int(chunk_texts(frames)[-1].removeprefix("stalled ")), signal.SIGKILL)
    frames = await receive_until(comm, is_turn_end)
    errors = [f["data"]["message"] for f in frames if f.get("kind") == "agent_error"]
    assert len(errors) == 1 and errors[0].startswith("agent exited with code -9"), errors
    assert frames[-1]["data"] == {"stop_reason": "error"}
    await assert_next_prompt_works(comm, session)
    await comm.disconnect()
