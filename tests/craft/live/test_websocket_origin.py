"""The websocket Origin check compares scheme, host and port with Craft's own origin."""

from __future__ import annotations

import pytest
import websocket
from channels.testing import WebsocketCommunicator

from craft.asgi import application

from ...embedded import embedded_env, serve
from ...server import close_code
from ..wsclient import CONNECT_TIMEOUT

SESSION = "00000000-0000-4000-8000-000000000000"


async def handshake(origin: str | None, host: str | None = "localhost:8000", **headers: str):
    """Return whether a handshake with these headers gets past the Origin check.

    Anonymous, so a handshake that passes is accepted and then closed with 4401.
    """
    raw = [(b"origin", origin.encode())] if origin is not None else []
    if host is not None:
        raw.append((b"host", host.encode()))
    raw += [(name.replace("_", "-").encode(), value.encode()) for name, value in headers.items()]
    comm = WebsocketCommunicator(application, f"/ws/sessions/{SESSION}/", headers=raw)
    connected, _ = await comm.connect(timeout=CONNECT_TIMEOUT)
    await comm.disconnect()
    return connected


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("origin", "host", "accepted"),
    [
        ("http://localhost:8000", "localhost:8000", True),
        ("http://LOCALHOST:8000", "localhost:8000", True),
        ("http://localhost:9999", "localhost:8000", False),  # another port
        ("https://localhost:8000", "localhost:8000", False),  # another scheme
        ("http://127.0.0.1:8000", "localhost:8000", False),  # another host
        ("http://localhost", "localhost", True),
        ("http://localhost:80", "localhost", True),  # the default port, spelt out
        ("http://localhost:8000", "localhost", False),
        ("http://evil.example:8000", "evil.example:8000", False),  # not an allowed host
        ("null", "localhost:8000", False),
        ("not a url", "localhost:8000", False),
        ("ftp://localhost:8000", "localhost:8000", False),
        (None, "localhost:8000", False),
        ("http://localhost:8000", None, False),  # no Host header, no server address
    ],
)
async def test_only_the_apps_own_origin_is_accepted(origin, host, accepted):
    assert await handshake(origin, host) is accepted


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("origin", "accepted"),
    [
        ("https://craft.example.com", True),
        ("https://craft.example.com:443", True),
        ("http://craft.example.com", False),
        ("https://craft.example.com:8443", False),
        ("https://team.example.org", True),  # a subdomain of the wildcard entry
        ("https://example.org", True),
        ("http://team.example.org", False),
        ("https://example.org.evil.example", False),
    ],
)
async def test_trusted_origins_are_accepted_with_their_scheme_and_port(settings, origin, accepted):
    settings.CSRF_TRUSTED_ORIGINS = ["https://craft.example.com", "https://*.example.org"]
    assert await handshake(origin, host="craft-internal:8000") is accepted


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_behind_a_tls_proxy_the_own_origin_is_https(settings):
    settings.ALLOWED_HOSTS = ["craft.example.com"]
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    origin, host = "https://craft.example.com", "craft.example.com"
    assert await handshake(origin, host, x_forwarded_proto="https")
    assert not await handshake(origin, host)  # the proxy did not say TLS
    assert not await handshake("http://craft.example.com", host, x_forwarded_proto="https")


def test_daphne_refuses_a_handshake_from_another_port(place, uid_base):
    var = place / "var"  # a checkout other users can enter, as make run's is
    with serve(embedded_env(var, uid_base), var) as server:
        port = server.url.rsplit(":", 1)[1]
        url = f"ws://127.0.0.1:{port}/ws/sessions/{SESSION}/"
        ws = websocket.create_connection(url, origin=server.url, timeout=10)
        try:
            # Past the Origin check: accepted, then closed because nobody signed in.
            code = close_code(ws)
        finally:
            ws.shutdown()  # close() would not close the socket after the server's close frame
        assert code == 4401
        for origin in ("http://127.0.0.1:9999", f"https://127.0.0.1:{port}", "http://evil.example"):
            with pytest.raises(websocket.WebSocketBadStatusException) as refused:
                websocket.create_connection(url, origin=origin, timeout=10)
            assert refused.value.status_code == 403, origin
