"""The status socket (`/ws/status/`) of pages without a session socket, through a real daphne:
it says which of a person's sessions changed, and that their sandbox changed, to them only;
it refuses whoever is not signed in and a foreign Origin, and closes on sign-out."""

from __future__ import annotations

import json
from typing import Any

import pytest
import websocket
from django.contrib.sessions.models import Session as BrowserSession

from tests.ready import open_ready_session
from tests.server import Daphne, Socket, api, close_code

from ..wsclient import session_cookie

pytestmark = pytest.mark.django_db(transaction=True)


class StatusSocket:
    def __init__(self, server: Daphne, user: Any, origin: str | None = None) -> None:
        header = [f"Cookie: {session_cookie(user)}"] if user is not None else []
        self.ws = websocket.create_connection(
            f"ws://127.0.0.1:{server.port}/ws/status/",
            header=header,
            origin=origin or server.url,
            timeout=30,
        )

    def frame(self) -> dict[str, Any]:
        return json.loads(self.ws.recv())

    def until(self, done: Any) -> list[dict[str, Any]]:
        frames = [self.frame()]
        while not done(frames[-1]):
            frames.append(self.frame())
        return frames


@pytest.fixture
def server(tmp_path):
    server = Daphne(tmp_path).start()
    yield server
    server.stop()


def test_a_person_hears_of_their_sessions_and_sandbox_and_no_one_else_does(server, owner, stranger):
    session = open_ready_session(owner, "Watched")
    mine = StatusSocket(server, owner)
    theirs = StatusSocket(server, stranger)
    assert mine.frame() == {"type": "hello"}
    assert theirs.frame() == {"type": "hello"}
    # A turn in another tab: the session's item changes (started, then ended with a title).
    tab = Socket(server, owner, session.pk)
    tab.send({"type": "resume", "after": 0})
    tab.send({"type": "prompt", "id": "p1", "text": "hello"})
    frames = mine.until(lambda f: f.get("type") == "sessions")
    assert frames[-1] == {"type": "sessions", "sessions": [str(session.pk)]}
    tab.until_kind("turn_end")
    tab.close()
    # The sandbox stopped from the API: the page fetches its sandbox line.
    assert api(server, owner, "DELETE", "/api/sandbox/")[0] == 200
    mine.until(lambda f: f == {"type": "sandbox"})
    # The stranger heard nothing of it: their socket's next frame is about their own change.
    other = open_ready_session(stranger, "Theirs")
    assert (
        api(server, stranger, "PATCH", f"/api/sessions/{other.pk}/", {"title": "Renamed"})[0] == 200
    )
    assert theirs.until(lambda f: f.get("type") == "sessions")[-1] == {
        "type": "sessions", "sessions": [str(other.pk)],
    }  # fmt: skip
    mine.ws.close()
    theirs.ws.close()


def test_nobody_signed_in_and_a_foreign_origin_are_refused(server, owner):
    anonymous = StatusSocket(server, None)
    assert close_code(anonymous.ws) == 4401  # accepted, then closed
    anonymous.ws.shutdown()
    with pytest.raises(websocket.WebSocketBadStatusException):
        StatusSocket(server, owner, origin="https://evil.example")


def test_a_sign_out_closes_it(tmp_path, owner):
    """Found by the server's re-check of its sockets' accounts (whatever the channel layer)."""
    server = Daphne(tmp_path, CRAFT_SOCKET_AUTH_CHECK_SECONDS="1").start()
    try:
        cookie = session_cookie(owner)
        ws = websocket.create_connection(
            f"ws://127.0.0.1:{server.port}/ws/status/",
            header=[f"Cookie: {cookie}"], origin=server.url, timeout=30,
        )  # fmt: skip
        assert json.loads(ws.recv()) == {"type": "hello"}
        BrowserSession.objects.filter(session_key=cookie.split("=", 1)[1]).delete()
        try:
            assert close_code(ws) == 4401
        finally:
            ws.shutdown()
    finally:
        server.stop()
