"""Previews through daphne, as root with sandbox users, the jail and the sandbox's own network:
the demo agent's `serve` app reached on the preview origin with a token (HTTP and its
websocket echo), and refused without one, with a bad, used or expired one, to another user,
on Craft's own origin, from another origin; a port nothing listens on gives a 502; Craft's
pages are not served on a preview host.

The preview origin is `http://{port}-{session}.localhost:<second port>`, served by the same
daphne on a second endpoint, as `make run` serves it; requests name the host in their Host
header (what a browser resolving `*.localhost` to loopback sends).
"""

from __future__ import annotations

import http.client
import json
import re
import time
import urllib.parse
from typing import Any

import pytest
import websocket
from django.core import signing

from craft.preview.passes import ENTRY_PATH, TOKEN_SALT
from tests.ports import free_port
from tests.ready import open_ready_session
from tests.sandboxes.hostile import contain, needs_root
from tests.server import Daphne, Socket, api_request

from ..wsclient import session_cookie

pytestmark = [pytest.mark.django_db(transaction=True), needs_root]

APP_PORT = 8080


class Preview:
    """Daphne serving Craft and, on a second port, the preview origin."""

    def __init__(self, server: Daphne, preview_port: int) -> None:
        self.server = server
        self.port = preview_port

    def host(self, session_id: Any, port: int = APP_PORT) -> str:
        return f"{port}-{session_id.hex}.localhost:{self.port}"

    def request(
        self,
        host: str,
        path: str,
        *,
        cookie: str = "",
        method: str = "GET",
        body: bytes | None = None,
        port: int | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", port or self.port, timeout=30)
        headers = {"Host": host}
        if cookie:
            headers["Cookie"] = cookie
        connection.request(method, path, body=body, headers=headers)
        answer = connection.getresponse()
        data = answer.read()
        connection.close()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, data


def csrf_cookie(server: Daphne, user) -> tuple[str, str]:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    connection.request("GET", "/accounts/login/")
    answer = connection.getresponse()
    answer.read()
    connection.close()
    token = re.search(r"csrftoken=([^;]+)", answer.getheader("Set-Cookie") or "")[1]
    return f"{session_cookie(user)}; csrftoken={token}", token


def ask_url(server: Daphne, user, session_id, port: int = APP_PORT) -> tuple[int, Any]:
    cookie, token = csrf_cookie(server, user)
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    connection.request(
        "POST",
        f"/api/sessions/{session_id}/preview/",
        body=json.dumps({"port": port}),
        headers={
            "Cookie": cookie,
            "X-CSRFToken": token,
            "Content-Type": "application/json",
            "Origin": server.url,
        },
    )
    answer = connection.getresponse()
    body = answer.read()
    connection.close()
    return answer.status, json.loads(body or b"null")


def path_of(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return f"{parts.path}?{parts.query}"


def enter(preview: Preview, url: str) -> str:
    """Follow a preview URL's entry; return the cookie it set (name=value)."""
    host = urllib.parse.urlsplit(url).netloc
    status, headers, _ = preview.request(host, path_of(url))
    assert status == 303, (status, headers)
    assert headers["location"] == "/"
    set_cookie = headers["set-cookie"]
    assert "HttpOnly" in set_cookie and "Domain" not in set_cookie
    assert "SameSite=None" in set_cookie and "Secure" in set_cookie
    return set_cookie.split(";", 1)[0]


@pytest.fixture
def preview(settings, machine, uid_base, owner):
    """Root's configuration (sandbox users, jail, network of its own, budget) in a daphne
    that serves previews; the owner's sandbox provisioned, its agent the demo agent."""
    contain(settings, "on")
    settings.CRAFT_AGENT_COMMAND = ["craft-demo-agent"]
    preview_port = free_port()
    origin = f"http://{{port}}-{{session}}.localhost:{preview_port}"
    settings.CRAFT_PREVIEW_ORIGIN = origin
    server = Daphne(
        settings.VAR_DIR,
        options=("-e", f"tcp:port={preview_port}:interface=127.0.0.1"),
        CRAFT_SANDBOX_UIDS="on",
        CRAFT_SANDBOX_ROOT=str(settings.CRAFT_SANDBOX_ROOT),
        CRAFT_SANDBOX_UID_BASE=str(uid_base),
        CRAFT_SANDBOX_UID_COUNT="1000",
        CRAFT_AGENT_COMMAND="craft-demo-agent",
        CRAFT_PREVIEW_ORIGIN=origin,
        CRAFT_SOCKET_AUTH_CHECK_SECONDS="0.5",
    ).start()
    yield Preview(server, preview_port)
    server.stop()


@pytest.fixture
def serving(preview, owner):
    """The owner's session whose agent started the demo app on APP_PORT (`serve`)."""
    session = open_ready_session(owner, "preview")
    socket = Socket(preview.server, owner, session.pk)
    socket.send({"type": "resume", "after": 0})
    socket.send({"type": "prompt", "id": "p1", "text": f"serve {APP_PORT}"})
    frames = socket.until_kind("turn_end")
    said = "".join(
        f["data"].get("content", {}).get("text", "")
        for f in frames
        if f.get("kind") == "agent_message_chunk"
    )
    assert "I started a demo app" in said, said
    yield session
    socket.close()


def test_the_agents_app_is_offered_and_shown_on_the_preview_origin_with_its_websocket(
    preview, serving, owner
):
    server = preview.server
    status, listed = api_request(
        server.url, session_cookie(owner), "GET", f"/api/sessions/{serving.pk}/preview/"
    )
    assert status == 200 and listed == {"enabled": True, "ports": [APP_PORT]}, listed

    status, given = ask_url(server, owner, serving.pk)
    assert status == 200, given
    host = preview.host(serving.pk)
    assert given["url"].startswith(f"http://{host}{ENTRY_PATH}?token=")
    cookie = enter(preview, given["url"])

    status, headers, page = preview.request(host, "/", cookie=cookie)
    assert status == 200
    assert f"Demo app on port {APP_PORT}" in page.decode()
    # Only Craft's page (the origin that asked for the link) may frame it.
    assert headers["content-security-policy"] == f"frame-ancestors {server.url}"
    # A body goes to the app, streamed.
    status, _, answer = preview.request(
        host, "/upload", cookie=cookie, method="POST", body=b"x" * 300_000
    )
    assert (status, answer) == (200, b"got 300000 bytes\n")

    ws = websocket.create_connection(
        f"ws://127.0.0.1:{preview.port}/ws",
        host=host,
        origin=f"http://{host}",
        cookie=cookie,
        subprotocols=["echo", "other"],
        timeout=30,
    )
    try:
        assert ws.subprotocol == "echo"
        ws.send("hello")
        assert ws.recv() == "echo: hello"
        ws.send_binary(b"\x00\x01")
        assert ws.recv() == b"echo: \x00\x01"
        # The app's close code reaches the browser.
        ws.send("close 4000")
        frame = ws.recv_frame()
        assert frame.opcode == websocket.ABNF.OPCODE_CLOSE
        assert int.from_bytes(frame.data[:2], "big") == 4000
    finally:
        ws.shutdown()


def test_a_preview_is_refused_without_a_good_token_or_cookie(preview, serving, owner):
    host = preview.host(serving.pk)
    # No cookie: the page says to open it from Craft.
    status, _, page = preview.request(host, "/")
    assert status == 403 and b"Open this preview from Craft" in page
    # A forged cookie.
    status, _, _ = preview.request(host, "/", cookie="craft_preview=forged")
    assert status == 403
    # No token, a forged one, one used already.
    assert preview.request(host, ENTRY_PATH)[0] == 403
    assert preview.request(host, f"{ENTRY_PATH}?token=abc")[0] == 403
    _, given = ask_url(preview.server, owner, serving.pk)
    enter(preview, given["url"])
    assert preview.request(host, path_of(given["url"]))[0] == 403
    # An expired one: signed a minute and more ago.
    old = signing.TimestampSigner(salt=TOKEN_SALT)
    old.timestamp = lambda: signing.b62_encode(int(time.time()) - 120)  # type: ignore[method-assign]
    payload = signing.dumps(
        [owner.pk, serving.pk.hex, APP_PORT, preview.server.url, "0" * 16], salt=TOKEN_SALT
    )
    value = signing.loads(payload, salt=TOKEN_SALT)
    expired = old.sign_object(value, serializer=signing.JSONSerializer)
    assert preview.request(host, f"{ENTRY_PATH}?token={expired}")[0] == 403
    # A token for another port is no good on this one.
    _, other_port = ask_url(preview.server, owner, serving.pk, port=9999)
    token = other_port["url"].split("?token=", 1)[1]
    assert preview.request(host, f"{ENTRY_PATH}?token={token}")[0] == 403


def test_a_preview_is_refused_to_another_user(preview, serving, owner, stranger):
    server = preview.server
    host = preview.host(serving.pk)
    # The API does not hand a stranger a link to someone else's session.
    status, _ = ask_url(server, stranger, serving.pk)
    assert status == 404
    status, _ = api_request(
        server.url, session_cookie(stranger), "GET", f"/api/sessions/{serving.pk}/preview/"
    )
    assert status == 404
    # The owner's cookie is the owner's: once the owner is no longer active, it opens nothing.
    _, given = ask_url(server, owner, serving.pk)
    cookie = enter(preview, given["url"])
    assert preview.request(host, "/", cookie=cookie)[0] == 200
    owner.is_active = False
    owner.save(update_fields=["is_active"])
    assert preview.request(host, "/", cookie=cookie)[0] == 403
    # A stranger's own session's cookie is no good on the owner's preview host either.
    owner.is_active = True
    owner.save(update_fields=["is_active"])
    theirs = open_ready_session(stranger, "theirs")
    _, given = ask_url(server, stranger, theirs.pk)
    their_cookie = enter(preview, given["url"])
    assert preview.request(host, "/", cookie=their_cookie)[0] == 403


def test_a_preview_websocket_needs_the_cookie_and_the_previews_own_origin(preview, serving, owner):
    host = preview.host(serving.pk)
    _, given = ask_url(preview.server, owner, serving.pk)
    cookie = enter(preview, given["url"])
    for origin, with_cookie in (
        (f"http://{host}", ""),  # no cookie
        (preview.server.url, cookie),  # Craft's page may not open it: only the preview's own
        ("http://evil.example", cookie),
    ):
        with pytest.raises(websocket.WebSocketBadStatusException) as refused:
            websocket.create_connection(
                f"ws://127.0.0.1:{preview.port}/ws",
                host=host,
                origin=origin,
                cookie=with_cookie or None,
                timeout=30,
            )
        assert refused.value.status_code == 403


def test_nothing_of_the_preview_is_served_on_crafts_origin_nor_craft_on_a_preview_host(
    preview, serving, owner
):
    server = preview.server
    _, given = ask_url(server, owner, serving.pk)
    # The entry path and the app's paths on Craft's own host are Craft's: not found.
    status, _, _ = preview.request(
        f"127.0.0.1:{server.port}", path_of(given["url"]), port=server.port
    )
    assert status == 404
    # Craft's pages, API, admin and static files on a preview host: the preview's 403.
    host = preview.host(serving.pk)
    for path in ("/accounts/login/", "/api/sessions/", "/admin/", "/static/craft/craft.css"):
        status, _, page = preview.request(host, path, cookie=session_cookie(owner))
        assert status == 403 and b"Open this preview from Craft" in page, path
    # Craft's session socket refuses a page of a preview origin.
    with pytest.raises(websocket.WebSocketBadStatusException) as refused:
        websocket.create_connection(
            f"ws://127.0.0.1:{server.port}/ws/sessions/{serving.pk}/",
            cookie=session_cookie(owner),
            origin=f"http://{host}",
            timeout=30,
        )
    assert refused.value.status_code == 403


def test_a_port_nothing_listens_on_gives_a_page_naming_it(preview, serving, owner):
    _, given = ask_url(preview.server, owner, serving.pk, port=9999)
    cookie = enter(preview, given["url"])
    status, _, page = preview.request(preview.host(serving.pk, 9999), "/", cookie=cookie)
    assert status == 502 and b"port 9999" in page


def test_the_app_going_away_gives_a_502_and_its_websocket_closes(preview, serving, owner):
    host = preview.host(serving.pk)
    _, given = ask_url(preview.server, owner, serving.pk)
    cookie = enter(preview, given["url"])
    ws = websocket.create_connection(
        f"ws://127.0.0.1:{preview.port}/ws", host=host, origin=f"http://{host}", cookie=cookie,
        timeout=30,
    )  # fmt: skip
    ws.send("hello")
    assert ws.recv() == "echo: hello"
    # The app is killed (its sandbox's processes but pasta: the agent and what it started).
    _kill_app(serving)
    assert ws.recv_frame().opcode == websocket.ABNF.OPCODE_CLOSE
    ws.shutdown()
    status, _, page = preview.request(host, "/", cookie=cookie)
    assert status == 502 and f"port {APP_PORT}".encode() in page


def _kill_app(session) -> None:
    """SIGKILL the processes of the session's sandbox user but its network's pasta."""
    import os
    import signal

    from tests.sandboxes.hostile import processes_of

    uid = os.stat(session.sandbox.reference).st_uid
    deadline = time.monotonic() + 30
    while pids := processes_of(uid):
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        assert time.monotonic() < deadline, "the app outlived SIGKILL"
        time.sleep(0.05)


def test_a_preview_websocket_closes_once_its_user_is_no_longer_active(preview, serving, owner):
    host = preview.host(serving.pk)
    _, given = ask_url(preview.server, owner, serving.pk)
    cookie = enter(preview, given["url"])
    ws = websocket.create_connection(
        f"ws://127.0.0.1:{preview.port}/ws", host=host, origin=f"http://{host}", cookie=cookie,
        timeout=30,
    )  # fmt: skip
    try:
        ws.send("hello")
        assert ws.recv() == "echo: hello"
        owner.is_active = False
        owner.save(update_fields=["is_active"])
        frame = ws.recv_frame()  # the re-check closes it (CRAFT_SOCKET_AUTH_CHECK_SECONDS)
        assert frame.opcode == websocket.ABNF.OPCODE_CLOSE
        assert int.from_bytes(frame.data[:2], "big") == 4403
    finally:
        ws.shutdown()
