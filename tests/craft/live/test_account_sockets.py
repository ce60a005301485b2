"""Open websockets follow the account: sign-out, a password change, deactivation or deletion
close them with 4401, and a socket cannot be reopened without signing in.
What no signal reaches (a change made by a command in another process without Redis, a
QuerySet update, an expired session) is found by each server's periodic re-check, which asks
the database about all of its sockets in two queries."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from datetime import timedelta

import pytest
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.contrib.sessions.models import Session as BrowserSession
from django.db import connection, connections
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from craft.live.accounts import account_sockets, account_state
from craft.storage.db import db_sync_to_async
from tests.ready import open_ready_session

from ...conftest import PASSWORD
from ...embedded import embedded_env, serve
from ...server import Daphne, Socket, close_code
from ...server import test_database_env as database_env  # not collected as a test
from ..wsclient import CONNECT_TIMEOUT, communicator, open_socket, session_cookie
from .test_redis_doorbell import REDIS_URL

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

SIGNED_OUT = {"type": "websocket.close", "code": 4401}


@pytest.fixture
def session(owner):
    return open_ready_session(owner, "account")


def browser(cookie: str) -> Client:
    """A test client holding the browser session of `cookie` ("sessionid=...")."""
    client = Client()
    client.cookies["sessionid"] = cookie.split("=", 1)[1]
    return client


async def closed_as_signed_out(comm) -> None:
    """Wait for the socket to be closed as signed out (how fast is not a test's business)."""
    assert await comm.receive_output(timeout=CONNECT_TIMEOUT) == SIGNED_OUT


async def refused(session_id, cookie) -> bool:
    comm = communicator(session_id, cookie)
    connected, _ = await comm.connect(timeout=CONNECT_TIMEOUT)
    return connected and await comm.receive_output(timeout=5) == SIGNED_OUT


async def two_browsers(session, owner):
    """Sockets of the owner from two browser sessions, A and B."""
    cookies = [await db_sync_to_async(session_cookie)(owner) for _ in range(2)]
    sockets = [(await open_socket(session.pk, cookie))[0] for cookie in cookies]
    return cookies, sockets


async def test_signing_out_closes_that_browser_s_sockets_only(session, owner):
    (cookie_a, _), (socket_a, socket_b) = await two_browsers(session, owner)
    response = await db_sync_to_async(browser(cookie_a).post)("/accounts/logout/")
    assert response.status_code == 302
    await closed_as_signed_out(socket_a)
    # Browser B is still signed in: its socket goes on.
    assert await socket_b.receive_nothing(0.3)
    await socket_b.send_json_to({"type": "resume", "after": 0})
    await socket_b.send_json_to({"type": "prompt", "id": "b", "text": "still here"})
    assert (await socket_b.receive_json_from(timeout=5))["kind"] == "user_message"
    assert await refused(session.pk, cookie_a)
    await socket_b.disconnect()


async def test_a_password_change_closes_every_socket_of_the_user(session, owner, stranger):
    (cookie_a, cookie_b), (socket_a, socket_b) = await two_browsers(session, owner)
    theirs = await db_sync_to_async(open_ready_session)(stranger, "theirs")
    their_socket, _ = await open_socket(theirs.pk, await db_sync_to_async(session_cookie)(stranger))
    new = "a new pass phrase 7"
    change = {"old_password": PASSWORD, "new_password1": new, "new_password2": new}
    client_a = browser(cookie_a)
    response = await db_sync_to_async(client_a.post)("/accounts/password_change/", change)
    assert response.status_code == 302, response.content[:500]
    for comm in (socket_a, socket_b):
        await closed_as_signed_out(comm)
    assert await their_socket.receive_nothing(0.3)  # someone else's account
    # The browser that changed it stays signed in (with a new session key) and reconnects;
    # the other one is signed out.
    socket_a, _ = await open_socket(session.pk, f"sessionid={client_a.cookies['sessionid'].value}")
    assert await refused(session.pk, cookie_b)
    for comm in (socket_a, their_socket):
        await comm.disconnect()


@pytest.mark.parametrize("end", ["deactivate", "delete"])
async def test_deactivating_or_deleting_the_user_closes_their_sockets(session, owner, end):
    cookie = await db_sync_to_async(session_cookie)(owner)
    comm, _ = await open_socket(session.pk, cookie)

    def end_account():
        if end == "deactivate":
            owner.is_active = False
            owner.save()
        else:
            owner.delete()

    await db_sync_to_async(end_account)()
    await closed_as_signed_out(comm)
    if end == "deactivate":
        assert await refused(session.pk, cookie)


async def test_saving_the_user_for_other_reasons_keeps_the_sockets(session, owner):
    comm, _ = await open_socket(session.pk, await db_sync_to_async(session_cookie)(owner))

    def edit():
        owner.first_name = "Olivia"
        owner.save()
        owner.save(update_fields=["last_login"])
        owner.is_active = True  # was already
        owner.save()

    await db_sync_to_async(edit)()
    assert await comm.receive_nothing(0.5)
    await comm.disconnect()


async def test_a_sign_out_between_authentication_and_joining_still_closes_it(
    session, owner, monkeypatch
):
    from craft.live.consumer import SessionConsumer

    join_account = SessionConsumer.join_account

    async def signed_out_meanwhile(self, user):
        # The handshake was authenticated; now the browser signs out, before the socket joins
        # its user's group, so the sign-out's broadcast cannot reach it.
        await db_sync_to_async(BrowserSession.objects.all().delete)()
        return await join_account(self, user)

    monkeypatch.setattr(SessionConsumer, "join_account", signed_out_meanwhile)
    comm = communicator(session.pk, await db_sync_to_async(session_cookie)(owner))
    connected, _ = await comm.connect(timeout=CONNECT_TIMEOUT)
    assert connected
    assert await comm.receive_output(timeout=5) == SIGNED_OUT


# --- across processes -----------------------------------------------------------------------


DEACTIVATE = """
import django, sys
django.setup()
from django.contrib.auth import get_user_model
user = get_user_model().objects.get(pk=int(sys.argv[1]))
user.is_active = False
user.save()
"""


async def test_deactivation_in_another_process_closes_sockets_through_redis(
    settings, owner, redis_layer
):
    session = await db_sync_to_async(open_ready_session)(owner, "redis")
    comm, _ = await open_socket(session.pk, await db_sync_to_async(session_cookie)(owner))
    db = django_settings.DATABASES["default"]
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "REDIS_URL": REDIS_URL,
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", DEACTIVATE, str(owner.pk), env=env, cwd=django_settings.BASE_DIR
    )
    assert await process.wait() == 0
    await closed_as_signed_out(comm)


async def test_signing_out_through_daphne_closes_the_socket(place, uid_base):
    # A checkout other users can enter, as make run's is.
    await asyncio.to_thread(sign_out_through_daphne, place / "var", uid_base)


def sign_out_through_daphne(var, uid_base):
    # The server's own re-check of a socket's account comes only after an hour: a close at all
    # shows the sign-out's signal reached the socket.
    env = embedded_env(var, uid_base, CRAFT_SOCKET_AUTH_CHECK_SECONDS="3600")
    with serve(env, var) as server:
        session = server.post_json("/api/sessions/", {"title": "daphne"})
        ws = server.socket(session["id"])
        page = server.opener.open(f"{server.url}/", timeout=10).read().decode()
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
        logout = f"csrfmiddlewaretoken={token}".encode()
        server.opener.open(f"{server.url}/accounts/logout/", data=logout, timeout=10)
        try:
            code = close_code(ws)
        finally:
            ws.shutdown()
        assert code == 4401


# --- the re-check: what no signal reaches ----------------------------------------------------


def end_behind_the_signals_back(end: str, user_id: int, session_key: str) -> None:
    """End the right to a socket the way no model signal of the user sees."""
    users = get_user_model().objects.filter(pk=user_id)
    if end == "password":
        users.update(password=make_password("changed behind its back 3"))
    elif end == "deactivate":
        users.update(is_active=False)
    elif end == "signed out":
        BrowserSession.objects.filter(session_key=session_key).delete()
    else:  # expired
        yesterday = timezone.now() - timedelta(days=1)
        BrowserSession.objects.filter(session_key=session_key).update(expire_date=yesterday)


@pytest.mark.parametrize("end", ["password", "deactivate", "signed out", "expired"])
async def test_the_recheck_closes_sockets_whose_account_ended_without_a_signal(
    session, owner, stranger, settings, end
):
    settings.CRAFT_SOCKET_AUTH_CHECK_SECONDS = 0.5
    (cookie_a, _), (socket_a, socket_b) = await two_browsers(session, owner)
    theirs = await db_sync_to_async(open_ready_session)(stranger, "theirs")
    their_socket, _ = await open_socket(theirs.pk, await db_sync_to_async(session_cookie)(stranger))
    key_a = cookie_a.split("=", 1)[1]
    await db_sync_to_async(end_behind_the_signals_back)(end, owner.pk, key_a)
    assert await socket_a.receive_output(timeout=10) == SIGNED_OUT
    if end in ("password", "deactivate"):  # the account: every browser of it
        assert await socket_b.receive_output(timeout=10) == SIGNED_OUT
    else:  # one browser session: the other goes on
        await socket_b.send_json_to({"type": "resume", "after": 0})
        await socket_b.send_json_to({"type": "cancel"})
        assert (await socket_b.receive_json_from(timeout=10))["code"] == "not_running"
        await socket_b.disconnect()
    # Someone else's account, checked in the same passes, is untouched.
    await their_socket.send_json_to({"type": "cancel"})
    assert (await their_socket.receive_json_from(timeout=10))["code"] == "not_running"
    await their_socket.disconnect()


async def test_the_recheck_runs_only_while_sockets_are_held(session, owner, settings):
    settings.CRAFT_SOCKET_AUTH_CHECK_SECONDS = 0.5
    registry = account_sockets()
    cookie = await db_sync_to_async(session_cookie)(owner)
    comm, _ = await open_socket(session.pk, cookie)
    task = registry._task
    assert task is not None and not task.done()
    await comm.disconnect()
    # The last socket gone, its task goes too: none is left asleep on a loop that may close.
    assert registry._task is None
    await asyncio.wait([task], timeout=10)
    assert task.cancelled()

    # The re-check itself closes the last socket: the close is not cut short by the task's
    # own cancelling; the task ends by itself.
    comm, _ = await open_socket(session.pk, cookie)
    task = registry._task
    assert task is not None and not task.done()
    await db_sync_to_async(end_behind_the_signals_back)("password", owner.pk, "")
    assert await comm.receive_output(timeout=10) == SIGNED_OUT
    await asyncio.wait([task], timeout=10)
    assert task.done() and not task.cancelled()
    assert registry._task is None or registry._task.done()


async def test_the_recheck_asks_the_database_twice_whatever_the_number_of_sockets():
    def state_of_many_accounts():
        users = [get_user_model().objects.create_user(f"user{i}", password="x") for i in range(40)]
        keys = [session_cookie(user).split("=", 1)[1] for user in users for _ in range(3)]
        users[0].delete()
        BrowserSession.objects.filter(session_key=keys[-1]).delete()
        with CaptureQueriesContext(connection) as queries:
            hashes, live = account_state({user.pk for user in users}, set(keys))
        return len(queries), users, keys, hashes, live

    count, users, keys, hashes, live = await db_sync_to_async(state_of_many_accounts)()
    assert count == 2
    assert set(hashes) == {user.pk for user in users[1:]}
    assert live == set(keys[:-1])


async def test_a_password_changed_by_a_command_closes_a_server_s_sockets_without_redis(
    tmp_path, owner, stranger
):
    """The command runs in a process of its own, and the server's in-memory channel layer
    never hears of it: only the server's re-check can close the sockets."""
    await asyncio.to_thread(change_password_by_command, tmp_path, owner, stranger)


def change_password_by_command(tmp_path, owner, stranger):
    env = {k: v for k, v in database_env().items() if k != "REDIS_URL"}
    mine, theirs = open_ready_session(owner, "mine"), open_ready_session(stranger, "theirs")
    server = Daphne(tmp_path, base_env=env, CRAFT_SOCKET_AUTH_CHECK_SECONDS="1").start()
    sockets = []
    try:
        socket, their_socket = Socket(server, owner, mine.pk), Socket(server, stranger, theirs.pk)
        sockets += [socket, their_socket]
        # `manage.py changepassword` as an administrator types it; without a terminal
        # (a session of its own) it reads the new password twice from its input.
        command = subprocess.run(
            [sys.executable, "manage.py", "changepassword", "olivia"],
            input="a fresh pass phrase 9\n" * 2, env=env, cwd=django_settings.BASE_DIR,
            capture_output=True, text=True, timeout=60, start_new_session=True,
        )  # fmt: skip
        assert command.returncode == 0, command.stderr
        assert "Password changed successfully" in command.stdout
        socket.ws.settimeout(30)
        assert close_code(socket.ws) == 4401
        # Someone else's socket on the same server goes on.
        their_socket.send({"type": "cancel"})
        assert their_socket.frame()["code"] == "not_running"
    finally:
        for each in sockets:
            each.ws.shutdown()
        server.terminate()
        connections.close_all()  # this thread's: the test database is dropped after the run
