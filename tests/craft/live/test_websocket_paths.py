"""A websocket handshake to a path Craft does not serve is refused, through a real daphne.

Found from outside: a handshake to `/ws/sessions/<id>/terminals/` (a path Craft did not serve
then) was answered HTTP 500: the router raised for a route it did not know.
"""

from __future__ import annotations

import pytest
import websocket

from tests.ready import open_ready_session

from ...server import Daphne, Socket
from ..wsclient import session_cookie

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_handshake_to_a_path_craft_does_not_serve_is_refused_with_403(owner, tmp_path):
    session = open_ready_session(owner, "paths")
    server = Daphne(tmp_path).start()
    try:
        unknown = [
            f"/ws/sessions/{session.pk}/previews/",
            f"/ws/sessions/{session.pk}/terminals",
            f"/ws/sessions/{session.pk}",
            "/ws/sessions/not-a-session/",
            "/ws/",
            "/",
        ]
        for cookie in ([f"Cookie: {session_cookie(owner)}"], []):
            for path in unknown:
                with pytest.raises(websocket.WebSocketBadStatusException) as refused:
                    websocket.create_connection(
                        f"ws://127.0.0.1:{server.port}{path}",
                        header=cookie,
                        origin=server.url,
                        timeout=30,
                    )
                assert refused.value.status_code == 403, path
        # The path Craft serves still opens, on the same server.
        socket = Socket(server, owner, session.pk)
        assert socket.hello["session"] == str(session.pk)
        socket.close()
        assert "Traceback" not in server.log.read_text()
    finally:
        server.stop()
