"""What the agent asks of the person besides permission, and requests either side gives up on:
elicitation forms and URLs, `$/cancel_request` both ways, `session/close`, live terminal
output, and an agent that wants authentication. Each against the real demo agent."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from sandboxes.agent.protocol import (
    CLIENT_CAPABILITIES,
    AgentError,
    AuthRequired,
    ElicitationRequest,
    PermissionRequest,
    RequestWithdrawn,
    TurnEnd,
    TurnFailed,
    Update,
)
from sandboxes.in_sandbox import demo_agent

from ..agents import iter_prompt, reply_text, start_demo_agent

# This checkout's demo agent (the console script on PATH may be another checkout's).
DEMO = [sys.executable, str(Path(demo_agent.__file__))]


@pytest.fixture
def agent(tmp_path):
    connection = start_demo_agent(tmp_path / "ws", DEMO)
    yield connection
    connection.stop()


def run(connection, text, answer=None, timeout=20):
    """Run a turn; `answer(item)` is called for each elicitation request."""
    items = []
    for item in iter_prompt(connection, text, timeout=timeout):
        items.append(item)
        if isinstance(item, ElicitationRequest) and answer is not None and not item.refused:
            answer(item)
    return items


def only(items, kind):
    found = [item for item in items if isinstance(item, kind)]
    assert len(found) == 1, items
    return found[0]


def test_it_advertises_terminal_output_and_both_elicitation_modes():
    assert CLIENT_CAPABILITIES["_meta"] == {"terminal_output": True}
    assert CLIENT_CAPABILITIES["elicitation"] == {"form": {}, "url": {}}


def test_terminal_output_streams_in_tool_call_meta(agent):
    items = run(agent, "terminal 3 0")
    tools = [i.data for i in items if isinstance(i, Update) and i.kind.startswith("tool_call")]
    assert tools[0]["_meta"]["terminal_info"]["terminal_id"] == tools[0]["toolCallId"]
    chunks = [
        t["_meta"]["terminal_output"]["data"]
        for t in tools
        if "terminal_output" in t.get("_meta", {})
    ]
    assert chunks == ["step 1 of 3: ok\n", "step 2 of 3: ok\n", "step 3 of 3: ok\n"]
    assert tools[-1]["_meta"]["terminal_exit"] == {"terminal_id": tools[0]["toolCallId"],
                                                   "exit_code": 0, "signal": None}  # fmt: skip
    assert "live output" in reply_text(items)


def test_a_form_is_read_into_fields_and_accepted_with_values(agent):
    answered = {}

    def accept(request):
        answered["request"] = request
        agent.answer_elicitation(request.request_id, "accept", {"name": "x", "colour": "red"})

    items = run(agent, "elicit", accept)
    request = answered["request"]
    assert request.mode == "form"
    assert [(f["name"], f["type"], f["required"]) for f in request.fields] == [
        ("name", "string", True), ("replicas", "integer", False), ("ratio", "number", False),
        ("public", "boolean", False), ("colour", "enum", True),
    ]  # fmt: skip
    assert request.fields[4]["options"] == [{"value": "red", "title": "Red"},
                                            {"value": "green", "title": "Green"}]  # fmt: skip
    assert reply_text(items) == 'You accepted: {"colour": "red", "name": "x"}.'


def test_a_url_request_is_declined(agent):
    seen = []

    def decline(request):
        seen.append(request)
        agent.answer_elicitation(request.request_id, "decline")

    items = run(agent, "elicit url", decline)
    assert seen[0].url == "https://example.com/demo/authorize?step=1"
    assert seen[0].elicitation_id.startswith("demo-")
    assert reply_text(items) == "You declined."


def test_an_accepted_url_request_is_completed_once(agent):
    items = run(agent, "elicit url", lambda r: agent.answer_elicitation(r.request_id, "accept"))
    request = only(items, ElicitationRequest)
    completed = [
        i.data for i in items if isinstance(i, Update) and i.kind == "elicitation_complete"
    ]
    assert completed == [{"sessionUpdate": "elicitation_complete",
                          "elicitationId": request.elicitation_id}]  # fmt: skip
    assert reply_text(items) == "You accepted."


def test_a_form_of_1000_fields_is_refused_with_a_clear_message(agent):
    items = run(agent, "elicit many")
    request = only(items, ElicitationRequest)
    assert request.refused == "the form has 1000 fields; Craft shows forms of at most 100"
    assert request.fields == []
    assert "The client refused: the form has 1000 fields" in reply_text(items)
    assert isinstance(items[-1], TurnEnd)


def test_a_field_of_an_unknown_type_is_shown_as_unsupported(agent):
    items = run(agent, "elicit unknown", lambda r: agent.answer_elicitation(
        r.request_id, "accept", {"name": "n"}))  # fmt: skip
    request = only(items, ElicitationRequest)
    assert request.fields[1] == {"name": "shade", "type": "unsupported", "title": "Shade",
                                 "description": "", "required": False,
                                 "unsupported": "color"}  # fmt: skip
    assert reply_text(items) == 'You accepted: {"name": "n"}.'


def test_a_cancelled_turn_cancels_its_open_elicitation(agent):
    items = []
    for item in iter_prompt(agent, "elicit", timeout=20):
        items.append(item)
        if isinstance(item, ElicitationRequest):
            agent.cancel()
    assert items[-1] == TurnEnd("cancelled")


@pytest.mark.parametrize("kind", ["permission", "elicit"])
def test_an_agent_withdraws_its_own_request(agent, kind):
    items = run(agent, f"withdraw {kind} 0.2")
    asked = [i for i in items if isinstance(i, PermissionRequest | ElicitationRequest)]
    withdrawn = only(items, RequestWithdrawn)
    assert withdrawn.request_id == asked[0].request_id
    assert withdrawn.kind == ("elicitation" if kind == "elicit" else "permission")
    assert reply_text(items) == "I withdrew my request; the client confirmed."
    # Withdrawn means answered: a late answer from the person goes nowhere.
    assert not agent.answer_permission(withdrawn.request_id, "allow")
    assert not agent.answer_elicitation(withdrawn.request_id, "decline")


def test_a_request_craft_gives_up_on_is_withdrawn_with_cancel_request(agent):
    with pytest.raises(AgentError, match="no answer within"):
        agent.request("_demo/wait", {"seconds": 600}, timeout=0.3)
    # The agent says so when the client withdraws; it would answer itself only after 600 s.
    deadline = time.monotonic() + 60
    while "client withdrew request" not in agent.process.stderr_tail():
        assert time.monotonic() < deadline, agent.process.stderr_tail()
        time.sleep(0.05)
    assert "(already answered)" not in agent.process.stderr_tail()


def test_stopping_an_agent_that_can_close_sends_session_close(tmp_path):
    connection = start_demo_agent(tmp_path / "ws", [*DEMO, "--close"])
    assert connection.can_close
    session_id = connection.agent_session_id
    connection.stop()
    connection.wait_closed()
    assert f"closed session {session_id}" in connection.process.stderr_tail()


def test_an_agent_that_cannot_close_is_only_ended(agent):
    assert not agent.can_close
    agent.stop()
    agent.wait_closed()
    assert "closed session" not in agent.process.stderr_tail()


def test_an_agent_that_wants_authentication_says_how(tmp_path):
    with pytest.raises(AuthRequired) as raised:
        start_demo_agent(tmp_path / "ws", [*DEMO, "--auth"])
    assert [m["name"] for m in raised.value.methods] == ["Demo login", "Demo API key"]
    message = str(raised.value)
    assert "Authentication required (code -32000)" in message
    assert "Demo login (Sign in with a demo account)" in message
    assert "Demo API key (Set DEMO_API_KEY in the sandbox)" in message


def test_a_prompt_answered_with_auth_required_names_the_agent_s_methods(agent):
    items = list(iter_prompt(agent, "signin", timeout=20))
    failed = items[-1]
    assert isinstance(failed, TurnFailed)
    # Its stderr may come too: the line it wrote at session/new can be read off its pipe
    # after the turn began (stdout and stderr are read apart), and is then the turn's.
    auth = {key: failed.details[key] for key in ("reason", "authMethods", "keys")}
    assert auth == {"reason": "auth_required", "authMethods": [], "keys": []}
    assert set(failed.details) <= {"reason", "authMethods", "keys", "stderr", "stderr_line"}
    assert failed.message == (
        "The agent needs authentication first (Authentication required (code -32000)). "
        "It names no way to authenticate. It is given no key of yours: whoever runs Craft can "
        "have it ask for one (its catalog entry's credentials)."
    )
    assert "CRAFT_AGENT_ENV" not in failed.message
