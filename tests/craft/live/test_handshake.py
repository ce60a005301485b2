"""A websocket's handshake is answered before any database read, so that a database slow to
answer (hundreds of sockets opening at once) never makes the server drop the socket.

A real daphne, which drops a socket whose handshake is not answered within its connect timeout
(daphne's default, 5 s), and a real PostgreSQL in which the test holds a table the socket reads
locked until the handshake is answered: a handshake that waited for that read would never be.
The tables: Craft's sessions, and the browser sessions and users that say who is signed in.
One socket opens and closes first, so that what a just-started server does once is not
counted against that timeout.
"""

from __future__ import annotations

import json

import psycopg
import pytest
import websocket
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.sessions.models import Session as BrowserSession

from craft.models import Session
from tests.ready import open_ready_session

from ...server import Daphne, Socket
from ..wsclient import session_cookie

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    "table",
    [Session._meta.db_table, BrowserSession._meta.db_table, get_user_model()._meta.db_table],
)
def test_a_socket_opens_while_the_database_is_slow_and_gets_its_hello_after(owner, tmp_path, table):
    session = open_ready_session(owner, "slow database")
    cookie = session_cookie(owner)
    server = Daphne(tmp_path).start()
    db = settings.DATABASES["default"]
    try:
        Socket(server, owner, session.pk).ws.close()
        with psycopg.connect(
            host=db["HOST"], port=db["PORT"], user=db["USER"], dbname=db["NAME"]
        ) as blocker:
            # Every read of the table waits for this lock (the socket's own too).
            blocker.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
            try:
                ws = websocket.create_connection(
                    f"ws://127.0.0.1:{server.port}/ws/sessions/{session.pk}/",
                    header=[f"Cookie: {cookie}"],
                    origin=server.url,
                    timeout=30,
                )
            except (OSError, websocket.WebSocketException) as error:
                raise AssertionError(
                    f"handshake failed: {error!r}\nthe server's statements:\n"
                    f"{server_statements(server)}\n{server.log.read_text()[-2000:]}"
                ) from error
            # Answered while the lookup waits, which goes on waiting as long as the lock holds.
            ws.settimeout(1)
            with pytest.raises(websocket.WebSocketTimeoutException):
                ws.recv()
            blocker.rollback()  # the database answers again
        ws.settimeout(30)
        hello = json.loads(ws.recv())
        assert hello["type"] == "hello" and hello["session"] == str(session.pk)
        ws.close()
    finally:
        server.terminate()


def server_statements(server: Daphne) -> str:
    """What the server's database connections are doing now (PostgreSQL's own view)."""
    db = settings.DATABASES["default"]
    with psycopg.connect(
        host=db["HOST"], port=db["PORT"], user=db["USER"], dbname=db["NAME"]
    ) as connection:
        rows = connection.execute(
            "SELECT state, wait_event_type, wait_event, query FROM pg_stat_activity"
            " WHERE application_name = %s",
            (f"daphne-{server.port}",),
        ).fetchall()
    return "\n".join(" | ".join(str(value) for value in row) for row in rows)
