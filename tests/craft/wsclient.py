"""Drive the session websocket in-process with Channels' WebsocketCommunicator."""

from __future__ import annotations

import asyncio
from typing import Any

from channels.testing import WebsocketCommunicator
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.sessions.backends.db import SessionStore

from craft.asgi import application

ORIGIN = "http://localhost"
HOST = "localhost"  # the handshake's Host header: ORIGIN is then the app's own origin
# How long a handshake may take before a test fails (Channels' default is 1 s, which a loaded
# machine exceeds): a bound on a failure, never a wait.
CONNECT_TIMEOUT = 30


def session_cookie(user: Any) -> str:
    """Return a signed-in Django session cookie for `user` (sync: call it off the loop)."""
    store = SessionStore()
    store[SESSION_KEY] = str(user.pk)
    store[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    store[HASH_SESSION_KEY] = user.get_session_auth_hash()
    store.save()
    return f"sessionid={store.session_key}"


def communicator(session_id: Any, cookie: str | None, origin: str | None = ORIGIN):
    headers = [(b"host", HOST.encode())]
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    if cookie is not None:
        headers.append((b"cookie", cookie.encode()))
    return WebsocketCommunicator(application, f"/ws/sessions/{session_id}/", headers=headers)


async def open_socket(session_id: Any, cookie: str) -> tuple[WebsocketCommunicator, dict]:
    """Connect, check the hello frame, return the communicator and the hello."""
    comm = communicator(session_id, cookie)
    connected, _ = await comm.connect(timeout=CONNECT_TIMEOUT)
    assert connected
    hello = await comm.receive_json_from(timeout=CONNECT_TIMEOUT)
    assert hello["type"] == "hello"
    return comm, hello


async def receive_until(
    comm: WebsocketCommunicator, done: Any, timeout: float = 15
) -> list[dict[str, Any]]:
    """Collect frames until `done(frame)` is true; fail after `timeout` seconds, saying the
    last frames that came (and how long ago the last one did)."""
    frames: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last_at = loop.time()
    while True:
        remaining = deadline - loop.time()
        assert remaining > 0, f"gave up waiting; got {frames[-5:]}"
        try:
            frame = await comm.receive_json_from(timeout=remaining)
        except TimeoutError:
            quiet = loop.time() - last_at
            raise AssertionError(
                f"gave up waiting after {timeout} s, nothing for the last {quiet:.1f} s; "
                f"{len(frames)} frames, the last: {frames[-5:]}"
            ) from None
        last_at = loop.time()
        frames.append(frame)
        if done(frame):
            return frames


def is_turn_end(frame: dict[str, Any]) -> bool:
    return frame.get("type") == "event" and frame.get("kind") == "turn_end"


def events_of(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f for f in frames if f["type"] == "event"]
