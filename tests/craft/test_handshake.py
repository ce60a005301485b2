"""A websocket's handshake is answered before any database read, so that a database slow to
answer (hundreds of sockets opening at once) never makes the server drop the socket.

A real daphne that waits 1 s for a handshake (`--websocket_connect_timeout 1`), a real
PostgreSQL in which the test holds the sessions table locked for longer than that.
"""

from __future__ import annotations

import json

import psycopg
import pytest
import websocket
from django.conf import settings

from craft.models import Session
from tests.ready import open_ready_session

from ..server import Daphne
from .wsclient import session_cookie

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_socket_opens_while_the_database_is_slow_and_gets_its_hello_after(owner, tmp_path):
    session = open_ready_session(owner, "slow database")
    cookie = session_cookie(owner)
    server = Daphne(tmp_path, options=("--websocket_connect_timeout", "1")).start()
    db = settings.DATABASES["default"]
    try:
        with psycopg.connect(
            host=db["HOST"], port=db["PORT"], user=db["USER"], dbname=db["NAME"]
        ) as blocker:
            # Every read of a session waits for this lock (the socket's own lookup too).
            blocker.execute(f"LOCK TABLE {Session._meta.db_table} IN ACCESS EXCLUSIVE MODE")
            ws = websocket.create_connection(
                f"ws://127.0.0.1:{server.port}/ws/sessions/{session.pk}/",
                header=[f"Cookie: {cookie}"],
                origin=server.url,
                timeout=30,
            )
            # Answered while the lookup waits: the server's 1 s passes with the lock held.
            ws.settimeout(2)
            with pytest.raises(websocket.WebSocketTimeoutException):
                ws.recv()
            blocker.rollback()  # the database answers again
        ws.settimeout(30)
        hello = json.loads(ws.recv())
        assert hello["type"] == "hello" and hello["session"] == str(session.pk)
        ws.close()
    finally:
        server.terminate()
