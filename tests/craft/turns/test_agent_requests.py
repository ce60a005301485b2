"""What agents ask of people besides permission, through a real daphne and the real demo
agent: elicitation forms and URLs answered over the socket, requests the agent withdraws,
cancelled turns and killed servers closing open requests, live terminal output, agents that
want authentication, and `session/close` when an agent is stopped."""

from __future__ import annotations

import signal
import urllib.request

import pytest

from craft.models import Event, TurnRecord
from craft.turns.recovery import RESTARTED
from tests.ready import open_ready_session

from ...server import Daphne, Socket
from ..logs import log_of
from ..wsclient import session_cookie
from .test_restarts import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def servers(tmp_path):
    started: list[Daphne] = []

    def make(**env: str) -> Daphne:
        server = Daphne(tmp_path, **env)
        started.append(server)
        return server.start()

    yield make
    for server in started:
        server.stop()


@pytest.fixture
def socket(servers, owner):
    """A socket on a new session of the owner, resumed from the start."""
    session = open_ready_session(owner, "requests")
    sock = Socket(servers(), owner, session.pk)
    sock.send({"type": "resume", "after": 0})
    sock.session = session
    yield sock
    sock.close()


def ask(sock, text, kind="elicitation_request"):
    """Send a prompt; return the data of the first event of `kind` it leads to."""
    sock.send({"type": "prompt", "id": text, "text": text})
    return sock.until_kind(kind)[-1]["data"]


def turn_end(sock):
    frames = sock.until_kind("turn_end")
    return frames, "".join(
        f["data"]["content"]["text"] for f in frames if f.get("kind") == "agent_message_chunk"
    )


def error(sock):
    return sock.until(lambda f: f["type"] == "error")[-1]


def test_a_form_is_stored_then_accepted_with_checked_values(socket):
    request = ask(socket, "elicit")
    assert request["mode"] == "form" and request["message"] == "Configure the demo project"
    assert [f["type"] for f in request["fields"]] == ["string", "integer", "number", "boolean",
                                                      "enum"]  # fmt: skip
    assert request["answerable"] is True
    assert TurnRecord.objects.running().get(session=socket.session).pending == {
        request["request"]: {"kind": "elicitation"}
    }
    rid = request["request"]
    # Wrong answers are refused, saying why; the request stays open.
    socket.send({"type": "elicitation", "request": rid, "action": "accept", "content": {}})
    assert error(socket) == {"type": "error", "code": "invalid_content",
                             "message": "'Project name' is required"}  # fmt: skip
    bad = {"name": "x", "colour": "blue"}
    socket.send({"type": "elicitation", "request": rid, "action": "accept", "content": bad})
    assert error(socket)["message"] == "'blue' is not a choice of 'Colour'"
    socket.send({"type": "elicitation", "request": rid, "action": "maybe"})
    assert error(socket)["code"] == "bad_frame"
    good = {"name": "x", "colour": "green", "replicas": 3, "public": True}
    socket.send({"type": "elicitation", "request": rid, "action": "accept", "content": good})
    frames, said = turn_end(socket)
    answer = next(f for f in frames if f.get("kind") == "elicitation_answer")
    assert answer["data"] == {"request": rid, "action": "accept", "content": good}
    assert said == 'You accepted: {"colour": "green", "name": "x", "public": true, "replicas": 3}.'
    socket.send({"type": "elicitation", "request": rid, "action": "decline"})
    assert error(socket)["code"] == "unknown_request"


def test_a_url_request_shows_its_url_and_can_be_declined(socket):
    request = ask(socket, "elicit url")
    assert request["url"] == "https://example.com/demo/authorize?step=1"
    assert request["elicitationId"].startswith("demo-") and "fields" not in request
    socket.send({"type": "elicitation", "request": request["request"], "action": "decline"})
    assert turn_end(socket)[1] == "You declined."


def test_a_url_request_accepted_takes_no_values(socket):
    request = ask(socket, "elicit url")
    rid = request["request"]
    socket.send({"type": "elicitation", "request": rid, "action": "accept", "content": {"x": 1}})
    frames, said = turn_end(socket)
    answer = next(f["data"] for f in frames if f.get("kind") == "elicitation_answer")
    assert answer == {"request": rid, "action": "accept"}
    assert said == "You accepted."
    (complete,) = [f["data"] for f in frames if f.get("kind") == "elicitation_complete"]
    assert complete["elicitationId"] == request["elicitationId"]


def test_a_form_of_1000_fields_is_refused_with_a_clear_message_and_stored(socket):
    request = ask(socket, "elicit many")
    assert request["refused"] == "the form has 1000 fields; Craft shows forms of at most 100"
    assert "fields" not in request
    frames, said = turn_end(socket)
    assert said.startswith("The client refused: the form has 1000 fields")
    assert frames[-1]["data"] == {"stop_reason": "end_turn"}


def test_a_required_field_of_an_unknown_type_can_only_be_declined(socket):
    request = ask(socket, "elicit unknown-required")
    assert request["fields"][0]["type"] == "unsupported" and request["answerable"] is False
    rid = request["request"]
    socket.send({"type": "elicitation", "request": rid, "action": "accept", "content": {}})
    assert error(socket)["message"] == "this form asks for something Craft cannot show: decline it"
    socket.send({"type": "elicitation", "request": rid, "action": "decline"})
    assert turn_end(socket)[1] == "You declined."


def test_html_in_a_form_is_stored_as_the_agent_sent_it(socket):
    request = ask(socket, "elicit html")
    assert request["fields"][0]["title"] == "<b>Bold</b><img src=x onerror=alert(1)>"
    socket.send({"type": "elicitation", "request": request["request"], "action": "cancel"})
    assert turn_end(socket)[1] == "You cancelled."


def test_cancelling_the_turn_closes_its_open_elicitation(socket):
    request = ask(socket, "elicit")
    socket.send({"type": "cancel"})
    frames, _ = turn_end(socket)
    answers = [f["data"] for f in frames if f.get("kind") == "elicitation_answer"]
    assert answers == [{"request": request["request"], "action": "cancel",
                        "reason": "turn_cancelled"}]  # fmt: skip
    assert frames[-1]["data"] == {"stop_reason": "cancelled"}


@pytest.mark.parametrize("kind", ["permission", "elicit"])
def test_a_request_the_agent_withdraws_is_closed(socket, kind):
    asked = "permission_request" if kind == "permission" else "elicitation_request"
    request = ask(socket, f"withdraw {kind} 0.3", asked)
    frames, said = turn_end(socket)
    closed = [f["data"] for f in frames if f.get("kind", "").endswith("_answer")]
    if kind == "permission":
        assert closed == [{"request": request["request"], "option": None,
                           "outcome": "cancelled", "reason": "withdrawn"}]  # fmt: skip
    else:
        assert closed == [{"request": request["request"], "action": "cancel",
                           "reason": "withdrawn"}]  # fmt: skip
    assert said == "I withdrew my request; the client confirmed."
    assert not TurnRecord.objects.running().filter(session=socket.session).exists()


def test_a_killed_server_s_open_elicitation_is_closed_as_interrupted(servers, owner):
    session = open_ready_session(owner, "killed")
    first = servers()
    sock = Socket(first, owner, session.pk)
    sock.send({"type": "resume", "after": 0})
    request = ask(sock, "elicit")
    before = log_of(session)
    first.signal(signal.SIGKILL)
    first.wait(10)
    sock.close()
    servers()  # its start closes what the killed server left open
    wait_for(lambda: Event.objects.filter(session=session, kind="turn_end").exists(),
             what="the interrupted turn's end")  # fmt: skip
    after = log_of(session)
    assert [(kind, data) for _, kind, data in after[len(before) :]] == [
        ("elicitation_answer",
         {"request": request["request"], "action": "cancel", "reason": "interrupted"}),
        ("agent_error", {"message": RESTARTED, "reason": "server_restarted"}),
        ("turn_end", {"stop_reason": "interrupted"}),
    ]  # fmt: skip


def test_live_terminal_output_is_stored_in_the_tool_call_meta(socket):
    socket.send({"type": "prompt", "id": "t", "text": "terminal 3 0"})
    frames, said = turn_end(socket)
    metas = [f["data"].get("_meta", {}) for f in frames if f.get("kind", "").startswith("tool_")]
    assert "terminal_info" in metas[0]
    assert [m["terminal_output"]["data"] for m in metas if "terminal_output" in m] == [
        "step 1 of 3: ok\n", "step 2 of 3: ok\n", "step 3 of 3: ok\n"]  # fmt: skip
    assert metas[-1]["terminal_exit"]["exit_code"] == 0
    assert said == "The command finished (live output)."


def test_an_agent_that_wants_authentication_names_its_methods(servers, owner):
    session = open_ready_session(owner, "auth")
    sock = Socket(servers(CRAFT_AGENT_COMMAND="craft-demo-agent --auth"), owner, session.pk)
    sock.send({"type": "resume", "after": 0})
    sock.send({"type": "prompt", "id": "a", "text": "hello"})
    frames, _ = turn_end(sock)
    (failure,) = [f["data"] for f in frames if f.get("kind") == "agent_error"]
    assert failure["reason"] == "auth_required"
    assert [m["name"] for m in failure["authMethods"]] == ["Demo login", "Demo API key"]
    assert "Demo login (Sign in with a demo account)" in failure["message"]
    assert frames[-1]["data"] == {"stop_reason": "error"}
    sock.close()


def test_an_agent_that_can_close_hears_session_close_when_its_session_is_deleted(
    servers, owner, settings
):
    session = open_ready_session(owner, "close")
    server = servers(CRAFT_AGENT_COMMAND="craft-demo-agent --close")
    sock = Socket(server, owner, session.pk)
    sock.send({"type": "resume", "after": 0})
    sock.send({"type": "prompt", "id": "c", "text": "hello"})
    turn_end(sock)
    agent_session = wait_for(
        lambda: type(session).objects.get(pk=session.pk).agent_session_id, what="the agent"
    )
    delete = urllib.request.Request(
        f"{server.url}/api/sessions/{session.pk}/",
        method="DELETE",
        headers={"Cookie": f"{session_cookie(owner)}; csrftoken={'c' * 32}",
                 "X-CSRFToken": "c" * 32, "Origin": server.url},
    )  # fmt: skip
    with urllib.request.urlopen(delete, timeout=30) as answer:
        assert answer.status == 204
    log = server.log
    wait_for(lambda: f"closed session {agent_session}" in log.read_text(),
             what="session/close in the agent's stderr")  # fmt: skip
    sock.ws.close()


def test_a_prompt_answered_with_auth_required_says_so(socket):
    socket.send({"type": "prompt", "id": "s", "text": "signin"})
    frames, _ = turn_end(socket)
    (failure,) = [f["data"] for f in frames if f.get("kind") == "agent_error"]
    assert failure["reason"] == "auth_required" and failure["authMethods"] == []
    assert "It names no way to authenticate." in failure["message"]
    assert failure["keys"] == []
    assert frames[-1]["data"] == {"stop_reason": "error"}
