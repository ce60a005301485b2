"""The terminal websocket through daphne, with real sockets, as root with sandbox users on.

A new socket starts a shell and says `ready` with its id; output comes as `output` frames and
the shell's end as `exit`; a socket that comes back to the id gets the scrollback, then live
output. Only the session's owner, only Craft's own origin; past the person's limit a new
terminal is refused; bad frames get an error frame and cost nothing. Keystrokes are stored
nowhere.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import websocket

from craft.models import Event
from sandboxes.backends import budget, firewall, network
from sandboxes.terminals import SCROLLBACK_BYTES
from tests.catalog import KEY
from tests.ready import running_sandbox

from ...conftest import OPEN_SOCKETS
from ...server import Daphne, api, ask, close_code, closed_by_server, wait_for_log
from ...server import open_session as open_agent_session
from ..wsclient import session_cookie

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="sandbox users need root"),
    pytest.mark.django_db(transaction=True),
]

LIMIT = 2


@pytest.fixture(scope="module")
def server(django_db_setup, tmp_path_factory):
    """Daphne with sandbox users, their jail, network and budget, as `make run` as root."""
    place = Path(tempfile.mkdtemp(prefix="craft-containment-"))
    place.chmod(0o755)
    base = secrets.randbelow(1000) * 1000 + 1_100_000_000
    daphne = Daphne(
        tmp_path_factory.mktemp("terminal-server"),
        CRAFT_SANDBOX_UIDS="on",
        CRAFT_SANDBOX_ROOT=str(place / "sandboxes"),
        CRAFT_SANDBOX_UID_BASE=str(base),
        CRAFT_SANDBOX_UID_COUNT="1000",
        CRAFT_MAX_TERMINALS_PER_USER=str(LIMIT),
        # A client that stops reading is found out within seconds; one that reads, starved
        # of CPU on a loaded machine, may go a second without reading and must not be.
        CRAFT_SOCKET_BUFFER_BYTES="65536",
        CRAFT_SOCKET_STALL_SECONDS="5",
        DJANGO_ALLOWED_HOSTS="127.0.0.1,localhost",
    )
    try:
        yield daphne.start()
    finally:
        daphne.terminate(timeout=30)
        network.remove_installation(base)
        firewall.remove(base)
        budget.remove(base)
        shutil.rmtree(place, ignore_errors=True)


def open_session(server: Daphne, user: Any) -> str:
    """Open a session and wait for its sandbox to run; return its id."""
    status, session = api(server, user, "POST", "/api/sessions/", {})
    assert status == 201, session
    deadline = time.monotonic() + 60
    while (sandbox := api(server, user, "GET", "/api/sandbox/")[1])["status"] != "running":
        assert sandbox["status"] in ("provisioning", "running"), sandbox
        assert time.monotonic() < deadline, sandbox
        time.sleep(0.05)
    return session["id"]


def connect(
    server: Daphne, user: Any, session_id: str, query: str = "", origin: str | None = None
) -> websocket.WebSocket:
    header = [f"Cookie: {session_cookie(user)}"] if user is not None else []
    ws = websocket.create_connection(
        f"ws://127.0.0.1:{server.port}/ws/sessions/{session_id}/terminals/{query}",
        header=header,
        origin=origin or server.url,
        timeout=30,
    )
    OPEN_SOCKETS.add(ws)
    return ws


class Term:
    """A terminal socket, and what it was sent."""

    def __init__(self, ws: websocket.WebSocket) -> None:
        self.ws = ws
        self.shown = ""
        self.frames: list[dict[str, Any]] = []
        ready = self.frame()
        assert ready["type"] == "ready", ready
        self.id = ready["terminal"]

    def frame(self) -> dict[str, Any]:
        frame = json.loads(self.ws.recv())
        self.frames.append(frame)
        if frame["type"] == "output":
            self.shown += frame["data"]
        return frame

    def type(self, text: str) -> None:
        self.ws.send(json.dumps({"type": "input", "data": text}))

    def wait_for(self, pattern: str) -> re.Match[str]:
        while (found := re.search(pattern, self.shown)) is None:
            self.frame()
        return found

    def until(self, kind: str) -> dict[str, Any]:
        while (frame := self.frame())["type"] != kind:
            pass
        return frame


def test_a_new_terminal_runs_a_shell_as_the_sandbox_user_and_says_how_it_ended(server, owner):
    term = Term(connect(server, owner, open_session(server, owner)))
    term.type("echo u''id=$(id -u)\r")
    uid = int(term.wait_for(r"uid=(\d+)")[1])
    assert uid >= 1_100_000_000
    term.type("exit 7\r")
    assert term.until("exit") == {"type": "exit", "code": 7}
    assert close_code(term.ws) == 1000


def test_a_socket_that_comes_back_gets_the_scrollback_then_live_output(server, owner):
    session = open_session(server, owner)
    first = Term(connect(server, owner, session))
    first.type("echo BEF''ORE\r")
    first.wait_for("BEFORE")
    first.ws.close()
    again = Term(connect(server, owner, session, f"?terminal={first.id}"))
    assert again.id == first.id
    again.wait_for("BEFORE")  # the scrollback
    again.type("echo AF''TER\r")
    again.wait_for("AFTER")
    assert again.shown.count("BEFORE") == first.shown.count("BEFORE")  # once
    again.type("exit\r")
    again.until("exit")


def test_another_person_and_nobody_are_refused(server, owner, stranger):
    session = open_session(server, owner)
    term = Term(connect(server, owner, session))
    assert close_code(connect(server, stranger, session)) == 4403
    assert close_code(connect(server, stranger, session, f"?terminal={term.id}")) == 4403
    theirs = open_session(server, stranger)
    refused = connect(server, stranger, theirs, f"?terminal={term.id}")
    assert json.loads(refused.recv())["code"] == "no_terminal"
    assert close_code(refused) == 4404
    assert close_code(connect(server, None, session)) == 4401
    term.type("exit\r")
    term.until("exit")


def test_a_socket_from_another_origin_is_refused(server, owner):
    session = open_session(server, owner)
    with pytest.raises(websocket.WebSocketBadStatusException) as refused:
        connect(server, owner, session, origin="http://evil.example")
    assert refused.value.status_code == 403


def test_past_the_person_s_limit_a_new_terminal_is_refused(server, owner):
    session = open_session(server, owner)
    terms = [Term(connect(server, owner, session)) for _ in range(LIMIT)]
    refused = connect(server, owner, session)
    error = json.loads(refused.recv())
    assert error["type"] == "error" and error["code"] == "too_many_terminals", error
    assert close_code(refused) == 4429
    terms[0].type("exit\r")
    terms[0].until("exit")
    Term(connect(server, owner, session)).type("exit\r")  # room again
    terms[1].type("exit\r")
    terms[1].until("exit")


def test_bad_frames_get_an_error_and_the_terminal_goes_on(server, owner):
    term = Term(connect(server, owner, open_session(server, owner)))
    for bad in (
        "not json",
        json.dumps([1, 2]),
        json.dumps({"type": "input"}),
        json.dumps({"type": "input", "data": 5}),
        json.dumps({"type": "resize", "cols": 0, "rows": 10}),
        json.dumps({"type": "resize", "cols": True, "rows": 10}),
        json.dumps({"type": "prompt", "text": "hi"}),
    ):
        term.ws.send(bad)
        frame = term.until("error")
        assert frame["code"] in ("bad_json", "bad_frame"), (bad, frame)
    term.ws.send_binary(b"\x00\x01")
    assert term.until("error")["code"] == "bad_frame"
    term.ws.send(json.dumps({"type": "resize", "cols": 101, "rows": 31}))
    term.type("stty size\r")
    term.wait_for(r"31 101\r\n")


def test_keystrokes_are_stored_nowhere(server, owner):
    session = open_session(server, owner)
    term = Term(connect(server, owner, session))
    secret = secrets.token_hex(8)
    term.type(f"# {secret}\r")
    term.wait_for(secret)
    term.type("exit\r")
    term.until("exit")
    assert secret not in server.log.read_text()
    stored = Event.objects.filter(session_id=session).values_list("data", flat=True)
    assert all(secret not in json.dumps(data) for data in stored)


def test_the_scrollback_is_the_last_256_kib_whole_characters_first(server, owner):
    session = open_session(server, owner)
    first = Term(connect(server, owner, session))
    # 400,000 bytes of two-byte characters, then a mark.
    first.type("head -c 400000 /dev/zero | tr '\\0' a | sed 's/a/\\xc3\\xa9/g'; echo EN''D\r")
    first.wait_for("END")
    first.ws.close()
    again = Term(connect(server, owner, session, f"?terminal={first.id}"))
    again.wait_for("END")
    assert "\ufffd" not in again.shown  # no character cut in two
    assert SCROLLBACK_BYTES - 4 <= len(again.shown.encode()) <= SCROLLBACK_BYTES
    again.type("exit\r")
    again.until("exit")


def test_another_server_process_says_the_terminal_is_not_there(server, owner, tmp_path):
    session = open_session(server, owner)
    term = Term(connect(server, owner, session))
    other = Daphne(tmp_path, DJANGO_ALLOWED_HOSTS="127.0.0.1,localhost").start()
    try:
        refused = connect(other, owner, session, f"?terminal={term.id}")
        assert json.loads(refused.recv())["code"] == "no_terminal"
        assert close_code(refused) == 4404
    finally:
        other.stop()
    term.type("echo st''ill-here\r")
    term.wait_for("still-here")  # the first process's shell goes on
    term.type("exit\r")
    term.until("exit")


def test_a_terminal_gets_none_of_its_owner_s_keys(catalog_server, owner):
    key = "sk-olivia-terminal-0123456789"
    server = catalog_server()
    assert api(server, owner, "PUT", f"/api/credentials/{KEY}/", {"value": key})[0] == 200
    agent = open_agent_session(server, owner, "keyed")
    running_sandbox(owner)
    assert json.loads(ask(agent, "env"))[KEY] == key  # the agent has it
    term = Term(connect(server, owner, agent.hello["session"]))
    term.type(f"echo k''ey=${KEY}-; env; echo EN''D\r")
    assert term.wait_for(r"key=(\S*)-")[1] == ""
    term.wait_for("END")
    assert key not in term.shown
    agent.close()


def test_a_client_that_stops_reading_is_closed_and_comes_back_to_the_scrollback(server, owner):
    session = open_session(server, owner)
    term = Term(connect(server, owner, session))
    term.type("head -c 16000000 /dev/zero | tr '\\0' x; echo; echo EN''D\r")
    # Nothing read from here: what the server could not send piles up, past its limit.
    wait_for_log(server, "terminal socket: the client stopped reading; closing", count=1)
    # 4408, or a reset when the close frame behind megabytes of output was not read in time.
    assert closed_by_server(term.ws)
    again = Term(connect(server, owner, session, f"?terminal={term.id}"))
    read_until_end(again)  # the shell went on: the scrollback, then the rest
    again.type("exit\r")
    again.until("exit")


def read_until_end(term: Term) -> int:
    """Read a long output to its `END` line, keeping only its tail; return the x's read."""
    received = 0
    while not re.search(r"END\r\n", term.shown[-400:]):
        frame = term.frame()
        assert frame["type"] == "output", frame
        received += frame["data"].count("x")
        term.shown = term.shown[-400:]
    return received


def test_a_client_that_reads_gets_everything_however_fast_the_shell_prints(server, owner):
    term = Term(connect(server, owner, open_session(server, owner)))
    term.type("head -c 8000000 /dev/zero | tr '\\0' x; echo; echo EN''D\r")
    assert read_until_end(term) >= 8_000_000  # (and the few of the typed line's echo)
    term.type("exit\r")
    term.until("exit")
