"""Who is on a websocket: the Django session cookie, resolved once its handshake is answered.

Channels' `AuthMiddlewareStack` does the same job, but its session layer wraps `send` and
inspects the session on every outgoing message (to save it on HTTP responses), which costs
microseconds on each of the thousands of frames a turn streams, and it looks the user up on
asgiref's one shared thread, before the consumer can answer the handshake. Here the
middleware only parses the cookies and passes `send` through untouched; the consumer answers
the handshake, then calls `authenticate`, which looks the user up on
`craft.storage.db.db_calls`. Daphne drops a socket whose handshake is not answered within
its `--websocket_connect_timeout` (5 s by default): a lookup that waits for a busy database
(hundreds of sockets opening at once) must not be in its way. The checks are Django's own
(`django.contrib.auth.get_user`): the session's auth hash must match (a password change signs
other sessions out) and the backend refuses inactive users.
"""

from __future__ import annotations

from importlib import import_module
from types import SimpleNamespace
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user
from django.http.cookie import parse_cookie

from craft.storage.db import db_calls


def _resolve(session_key: str | None) -> tuple[Any, Any]:
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    return get_user(SimpleNamespace(session=store)), store  # type: ignore[arg-type]


async def authenticate(scope: dict[str, Any]) -> Any:
    """Look up who the socket's session cookie signs in; put `user` and `session` into its
    scope and return the user (`AnonymousUser` when nobody)."""
    key = scope["cookies"].get(settings.SESSION_COOKIE_NAME)
    scope["user"], scope["session"] = await db_calls.run(_resolve, key)
    return scope["user"]


class SessionAuthMiddleware:
    """Put `cookies` into a websocket's scope (`authenticate` reads them); leave `send` alone."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        cookie = b""
        for name, value in scope.get("headers", ()):
            if name == b"cookie":
                cookie = value
                break
        scope = {**scope, "cookies": parse_cookie(cookie.decode("latin1"))}
        return await self.inner(scope, receive, send)
